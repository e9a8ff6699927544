//! The live sandboxes of this adapter: slots against `max_concurrent_sandboxes`, per-sandbox
//! exec slots, activity for idle reaping, and the ids of stopped sandboxes (so `stop` stays
//! idempotent and calls on them get S004 instead of S002, with why they ended). A sandbox
//! whose agent is gone leaves the live set (and its slot) at once, and stays in `list` as
//! stopped until a `stop` names it or its idle timeout passes.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use agent_proto::client::AgentClient;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::backend::SandboxProcess;
use crate::error::SandboxError;

/// How many stopped ids are remembered; older ones answer S002 like ids never seen.
const REMEMBERED_STOPPED: usize = 4096;

pub struct Sandbox {
    pub id: Uuid,
    pub name: Option<String>,
    pub image: String,
    pub created: SystemTime,
    /// Environment every exec starts from (image config, then the create request).
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub idle_timeout: Duration,
    pub agent: AgentClient,
    pub process: Box<dyn SandboxProcess>,
    pub layer: PathBuf,
    /// What the sandbox was created with (`fork` repeats it; its snapshot layers are
    /// released when it stops).
    pub recipe: crate::ops::create::CreateOptions,
    exec_cap: usize,
    exec_slots: Arc<Semaphore>,
    calls_in_flight: AtomicUsize,
    last_activity: Mutex<Instant>,
    stopped: AtomicBool,
    /// Why the sandbox ended, once it has (for the calls it was serving).
    ended: watch::Sender<Option<String>>,
    /// Since when the sandbox's processes are frozen (`pause`); `None` while they run.
    paused_since: Mutex<Option<Instant>>,
    /// Held across a freeze or a thaw, so the two never interleave and a stop's thaw comes
    /// after any freeze already under way.
    transition: tokio::sync::Mutex<()>,
    /// Its exposed ports (`port::expose`): closed by `pause` (see `ops::pause`) and stop.
    pub exposures: crate::ops::expose::Exposures,
    /// Its running execs, by `exec_id` (`exec::cancel`, `list`).
    pub execs: crate::ops::cancel::RunningExecs,
    /// What the adapter knows of its background processes (`ops::process`).
    pub processes: crate::ops::process::Processes,
}

/// Held while an exec or fs call runs: the reaper leaves the sandbox alone meanwhile.
pub struct CallGuard {
    sandbox: Arc<Sandbox>,
    _exec_slot: Option<OwnedSemaphorePermit>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.sandbox.touch();
        self.sandbox.calls_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct NewSandbox {
    pub recipe: crate::ops::create::CreateOptions,
    pub id: Uuid,
    pub name: Option<String>,
    pub image: String,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub idle_timeout: Duration,
    pub exec_cap: usize,
    pub agent: AgentClient,
    pub process: Box<dyn SandboxProcess>,
    pub layer: PathBuf,
}

impl Sandbox {
    fn new(new: NewSandbox) -> Self {
        Self {
            id: new.id,
            name: new.name,
            image: new.image,
            created: SystemTime::now(),
            env: new.env,
            workdir: new.workdir,
            idle_timeout: new.idle_timeout,
            agent: new.agent,
            process: new.process,
            layer: new.layer,
            recipe: new.recipe,
            exec_cap: new.exec_cap,
            exec_slots: Arc::new(Semaphore::new(new.exec_cap)),
            calls_in_flight: AtomicUsize::new(0),
            last_activity: Mutex::new(Instant::now()),
            stopped: AtomicBool::new(false),
            ended: watch::Sender::new(None),
            paused_since: Mutex::new(None),
            transition: tokio::sync::Mutex::new(()),
            exposures: crate::ops::expose::Exposures::default(),
            execs: Default::default(),
            processes: Default::default(),
        }
    }

    pub fn is_paused(&self) -> bool {
        lock(&self.paused_since).is_some()
    }

    /// Freezes the sandbox's processes (idempotent). S004 once it is stopped: a stop thaws
    /// what it tears down, and nothing may freeze it again after that.
    pub async fn pause(&self) -> Result<(), SandboxError> {
        let _transition = self.transition.lock().await;
        if self.is_stopped() {
            return Err(SandboxError::Stopped(self.id.to_string()));
        }
        if self.is_paused() {
            return Ok(());
        }
        self.process.pause().await?;
        *lock(&self.paused_since) = Some(Instant::now());
        Ok(())
    }

    /// Thaws the sandbox's processes (idempotent). Its idle timer starts afresh: the time
    /// it spent paused is not idleness.
    pub async fn resume(&self) -> Result<(), SandboxError> {
        let _transition = self.transition.lock().await;
        if !self.is_paused() {
            return Ok(());
        }
        self.process.resume().await?;
        *lock(&self.paused_since) = None;
        self.touch();
        Ok(())
    }

    /// Paused for at least `max` at `now`.
    fn paused_past(&self, now: Instant, max: Duration) -> bool {
        lock(&self.paused_since).is_some_and(|since| now.duration_since(since) >= max)
    }

    /// Marks the sandbox stopped, saying why (the first cause given stays).
    fn end(&self, cause: &str) {
        self.stopped.store(true, Ordering::SeqCst);
        self.ended.send_if_modified(|ended| {
            let first = ended.is_none();
            if first {
                *ended = Some(cause.to_string());
            }
            first
        });
    }

    /// Why the sandbox ended, waiting up to `wait` for the verdict (the watcher of a dead
    /// agent reads the process's exit status first); `None` while still undecided.
    pub async fn end_cause(&self, wait: Duration) -> Option<String> {
        let mut ended = self.ended.subscribe();
        let cause = tokio::time::timeout(wait, ended.wait_for(Option::is_some))
            .await
            .ok()?
            .ok()?
            .clone();
        cause
    }

    pub(crate) fn touch(&self) {
        *lock(&self.last_activity) = Instant::now();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    pub fn execs_in_flight(&self) -> usize {
        self.exec_cap - self.exec_slots.available_permits()
    }

    pub fn exec_slots_free(&self) -> usize {
        self.exec_slots.available_permits()
    }

    pub fn exec_cap(&self) -> usize {
        self.exec_cap
    }

    /// Idle long enough to be reaped, with no call in flight. A paused sandbox's idle timer
    /// does not run (`max_paused_secs` bounds it instead).
    pub fn is_idle(&self, now: Instant) -> bool {
        !self.is_paused()
            && self.calls_in_flight.load(Ordering::SeqCst) == 0
            && now.duration_since(*lock(&self.last_activity)) >= self.idle_timeout
    }

    /// Starts an exec: takes one of the sandbox's exec slots or fails with S003.
    fn begin_exec(self: &Arc<Self>) -> Result<CallGuard, SandboxError> {
        let slot = Arc::clone(&self.exec_slots)
            .try_acquire_owned()
            .map_err(|_| SandboxError::ExecLimit {
                sandbox_id: self.id.to_string(),
                cap: self.exec_cap,
            })?;
        Ok(self.guard(Some(slot)))
    }

    fn guard(self: &Arc<Self>, slot: Option<OwnedSemaphorePermit>) -> CallGuard {
        self.calls_in_flight.fetch_add(1, Ordering::SeqCst);
        self.touch();
        CallGuard {
            sandbox: Arc::clone(self),
            _exec_slot: slot,
        }
    }
}

#[derive(Default)]
struct State {
    live: HashMap<Uuid, Arc<Sandbox>>,
    /// Creates that hold a slot but have not finished booting.
    creating: usize,
    /// Slots held by the warm pool (sandboxes booting or waiting for a create; not in `live`).
    pooled: usize,
    stopped: HashMap<Uuid, Ended>,
    stopped_order: VecDeque<Uuid>,
}

/// What is remembered of a stopped sandbox.
struct Ended {
    /// Why it ended, when not by `stop` or the idle reaper (its agent died).
    cause: Option<String>,
    /// Still shown by `list` (as stopped) until this instant: sandboxes whose agent died,
    /// whose caller has not said `stop` yet.
    listed: Option<(Dead, Instant)>,
}

/// A sandbox that ended by itself, as `list` shows it.
#[derive(Debug, Clone)]
pub struct Dead {
    pub id: Uuid,
    pub name: Option<String>,
    pub image: String,
    pub created: SystemTime,
    pub cause: String,
}

pub struct Registry {
    cap: usize,
    state: Mutex<State>,
}

/// A slot held by a create in progress; released on drop unless the sandbox was added.
pub struct Reservation<'a> {
    registry: &'a Registry,
    settled: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.registry.state().creating -= 1;
        }
    }
}

impl Reservation<'_> {
    pub fn insert(mut self, new: NewSandbox) -> Arc<Sandbox> {
        let sandbox = Arc::new(Sandbox::new(new));
        let mut state = self.registry.state();
        state.creating -= 1;
        state.live.insert(sandbox.id, Arc::clone(&sandbox));
        self.settled = true;
        sandbox
    }
}

/// What `list` reports about the registry as a whole.
pub struct Occupancy {
    pub in_flight: usize,
    pub cap: usize,
    /// Slots the warm pool holds (they yield to a create, see `warm_pool.rs`).
    pub pooled: usize,
}

impl Registry {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Takes a slot for a new sandbox, or fails with S400 at `max_concurrent_sandboxes`.
    pub fn reserve(&self) -> Result<Reservation<'_>, SandboxError> {
        let mut state = self.state();
        if state.live.len() + state.creating + state.pooled >= self.cap {
            return Err(SandboxError::ResourceLimit(format!(
                "max_concurrent_sandboxes ({}) reached; stop a sandbox first",
                self.cap
            )));
        }
        state.creating += 1;
        Ok(Reservation {
            registry: self,
            settled: false,
        })
    }

    /// A live sandbox, or S004 if it was stopped, or S002 if never seen.
    fn find(state: &State, id: Uuid) -> Result<Arc<Sandbox>, SandboxError> {
        if let Some(sandbox) = state.live.get(&id) {
            return Ok(Arc::clone(sandbox));
        }
        match state.stopped.get(&id) {
            Some(Ended {
                cause: Some(cause), ..
            }) => Err(SandboxError::Stopped(format!("{id} ({cause})"))),
            Some(_) => Err(SandboxError::Stopped(id.to_string())),
            None => Err(SandboxError::UnknownSandbox(id.to_string())),
        }
    }

    /// A live sandbox (S004 if stopped, S002 if never seen), without starting a call on it.
    pub fn live_sandbox(&self, id: Uuid) -> Result<Arc<Sandbox>, SandboxError> {
        Self::find(&self.state(), id)
    }

    /// Starts an exec on a live sandbox. Done under the registry lock, so the reaper, which
    /// checks idleness under the same lock, can never take a sandbox a call is entering.
    pub fn begin_exec(&self, id: Uuid) -> Result<(Arc<Sandbox>, CallGuard), SandboxError> {
        let state = self.state();
        let sandbox = Self::find(&state, id)?;
        let guard = sandbox.begin_exec()?;
        Ok((sandbox, guard))
    }

    /// Starts a call that needs no exec slot (the fs functions) on a live sandbox, under the
    /// registry lock like `begin_exec`, so the reaper never takes a sandbox mid-call.
    pub fn begin_call(&self, id: Uuid) -> Result<(Arc<Sandbox>, CallGuard), SandboxError> {
        let state = self.state();
        let sandbox = Self::find(&state, id)?;
        let guard = sandbox.guard(None);
        Ok((sandbox, guard))
    }

    /// Takes out every sandbox idle past its timeout with no call in flight.
    pub fn take_idle(&self, now: Instant) -> Vec<Arc<Sandbox>> {
        let mut state = self.state();
        let idle: Vec<Uuid> = state
            .live
            .values()
            .filter(|s| s.is_idle(now))
            .map(|s| s.id)
            .collect();
        let mut taken = Vec::with_capacity(idle.len());
        for id in idle {
            if let Some(sandbox) = state.live.remove(&id) {
                sandbox.end(&format!(
                    "stopped after {} s without activity",
                    sandbox.idle_timeout.as_secs()
                ));
                remember_stopped(&mut state, id, None, None);
                taken.push(sandbox);
            }
        }
        // Dead sandboxes nobody stopped leave `list` after their idle timeout too.
        for ended in state.stopped.values_mut() {
            if ended
                .listed
                .as_ref()
                .is_some_and(|(_, until)| now >= *until)
            {
                ended.listed = None;
            }
        }
        taken
    }

    /// Takes out every sandbox paused for `max_paused` or longer (`max_paused_secs`), calls
    /// in flight or not: a call on a sandbox paused under it waits for a resume, and pausing
    /// must not keep a sandbox's resources for ever.
    pub fn take_paused_past(&self, now: Instant, max_paused: Duration) -> Vec<Arc<Sandbox>> {
        let mut state = self.state();
        let expired: Vec<Uuid> = state
            .live
            .values()
            .filter(|s| s.paused_past(now, max_paused))
            .map(|s| s.id)
            .collect();
        let mut taken = Vec::with_capacity(expired.len());
        for id in expired {
            if let Some(sandbox) = state.live.remove(&id) {
                sandbox.end(&format!(
                    "stopped after {} s paused (max_paused_secs)",
                    max_paused.as_secs()
                ));
                remember_stopped(&mut state, id, None, None);
                taken.push(sandbox);
            }
        }
        taken
    }

    /// Takes a sandbox out of the live set (the caller then tears it down). `Ok(None)` when it
    /// was already stopped; a dead sandbox then leaves `list`.
    pub fn take(&self, id: Uuid, remember: bool) -> Result<Option<Arc<Sandbox>>, SandboxError> {
        let mut state = self.state();
        match state.live.remove(&id) {
            Some(sandbox) => {
                sandbox.end("stopped by a `stop` call");
                if remember {
                    remember_stopped(&mut state, id, None, None);
                }
                Ok(Some(sandbox))
            }
            None => match state.stopped.get_mut(&id) {
                Some(ended) => {
                    ended.listed = None;
                    Ok(None)
                }
                None => Err(SandboxError::UnknownSandbox(id.to_string())),
            },
        }
    }

    /// Takes out a sandbox whose agent is gone, remembering `cause` for later calls and
    /// keeping it in `list` as stopped; its slot is free at once. `None` when it was no
    /// longer live (stopped meanwhile).
    pub fn take_dead(&self, id: Uuid, cause: &str) -> Option<Arc<Sandbox>> {
        let mut state = self.state();
        let sandbox = state.live.remove(&id)?;
        sandbox.end(cause);
        let dead = Dead {
            id,
            name: sandbox.name.clone(),
            image: sandbox.image.clone(),
            created: sandbox.created,
            cause: cause.to_string(),
        };
        let until = Instant::now()
            .checked_add(sandbox.idle_timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        remember_stopped(&mut state, id, Some(cause.to_string()), Some((dead, until)));
        Some(sandbox)
    }

    pub fn is_live(&self, id: Uuid) -> bool {
        self.state().live.contains_key(&id)
    }

    /// The live sandboxes and those that ended by themselves and are still listed, each
    /// oldest first, read at one instant: a sandbox whose agent dies meanwhile is in one list,
    /// never in both or neither.
    pub fn listing(&self) -> (Vec<Arc<Sandbox>>, Vec<Dead>) {
        let now = Instant::now();
        let state = self.state();
        let mut live: Vec<_> = state.live.values().cloned().collect();
        live.sort_by_key(|s| s.created);
        let mut dead: Vec<Dead> = state
            .stopped
            .values()
            .filter_map(|e| e.listed.as_ref())
            .filter(|(_, until)| now < *until)
            .map(|(dead, _)| dead.clone())
            .collect();
        dead.sort_by_key(|d| d.created);
        (live, dead)
    }

    pub fn live(&self) -> Vec<Arc<Sandbox>> {
        self.listing().0
    }

    pub fn occupancy(&self) -> Occupancy {
        let state = self.state();
        Occupancy {
            in_flight: state.live.len() + state.creating,
            cap: self.cap,
            pooled: state.pooled,
        }
    }

    /// Takes a slot for the warm pool, if one is free.
    pub fn hold_pool_slot(&self) -> bool {
        let mut state = self.state();
        if state.live.len() + state.creating + state.pooled >= self.cap {
            return false;
        }
        state.pooled += 1;
        true
    }

    /// Gives back a slot of the warm pool (its sandbox is gone, or its boot failed).
    pub fn release_pool_slot(&self) {
        let mut state = self.state();
        state.pooled = state.pooled.saturating_sub(1);
    }

    /// A pooled sandbox's slot passed to a create (the pooled sandbox is being evicted).
    pub fn pool_slot_for_create(&self) -> Reservation<'_> {
        let mut state = self.state();
        state.pooled = state.pooled.saturating_sub(1);
        state.creating += 1;
        Reservation {
            registry: self,
            settled: false,
        }
    }

    /// A pooled sandbox handed out: it joins the live set with its slot, created (and idle
    /// from) now.
    pub fn adopt(&self, new: NewSandbox) -> Arc<Sandbox> {
        let sandbox = Arc::new(Sandbox::new(new));
        let mut state = self.state();
        state.pooled = state.pooled.saturating_sub(1);
        state.live.insert(sandbox.id, Arc::clone(&sandbox));
        sandbox
    }
}

fn remember_stopped(
    state: &mut State,
    id: Uuid,
    cause: Option<String>,
    listed: Option<(Dead, Instant)>,
) {
    if state.stopped.insert(id, Ended { cause, listed }).is_none() {
        state.stopped_order.push_back(id);
    }
    while state.stopped_order.len() > REMEMBERED_STOPPED {
        if let Some(old) = state.stopped_order.pop_front() {
            state.stopped.remove(&old);
        }
    }
}

/// A poisoned lock only means another call panicked while holding it; the data (counters,
/// maps) is still consistent enough to keep serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
