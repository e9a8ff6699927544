//! The warm pool (`warm_pool: {image: count}`): sandboxes booted ahead of any create, so a
//! create that matches takes one instead of booting on the caller's path; the pool refills in
//! the background. Written over [`Backend`], so every backend has it.
//!
//! The rules, as the README states them:
//! - A create is served from the pool when it asks for a pooled image by the same name and
//!   for exactly the defaults that decide how a sandbox boots: `cpus` and `memory_mb` absent
//!   or equal to `default_cpus` / `default_memory_mb`, and `network` absent or false. `name`,
//!   `env` and `idle_timeout_secs` never change a boot (the environment is given to each exec,
//!   not to the guest at boot), so they do not stop a match. `run` creates the same way.
//! - A pooled sandbox is booted with an id nobody has seen, runs nothing but its agent, and is
//!   handed out once (taken out of the pool under its lock): its `created` time and idle
//!   timer start at the handout, like a fresh create's.
//! - Pooled sandboxes hold slots of `max_concurrent_sandboxes`, but yield them: a create that
//!   finds every slot taken evicts a pooled sandbox (another image's first) and boots in its
//!   slot; the pool refills only when slots are free again.
//! - They are not in the registry's live set: `list` does not show them among `sandboxes`
//!   (it reports `pooled`), the idle reaper never sees them, calls naming their id are S002.
//! - On disk they are sandboxes like any other (a layer recording its owner and process), so
//!   the start-up reconciliation removes those a killed adapter left; an orderly shutdown
//!   stops them with the rest.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use agent_proto::client::AgentClient;
use image_store::{ImageStore, PreparedImage};
use serde_json::{json, Value};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::backend::{Backend, SandboxProcess};
use crate::config::Config;
use crate::ops::create::{
    boot_sandbox, check_host_can_boot, new_sandbox, Boot, CreateOptions, Fresh, Phases,
    AGENT_HELLO_TIMEOUT,
};
use crate::plugin::SandboxPlugin;
use crate::registry::{Reservation, Sandbox};

/// How often the refiller looks again without being woken (a stop freed a slot, a backoff
/// ended).
const REFILL_TICK: Duration = Duration::from_millis(500);
/// How long the refill waits after a change before it boots (see `spawn`): longer than a
/// caller's create -> first exec (a few ms), short beside a boot's own time.
const REFILL_SETTLE: Duration = Duration::from_millis(20);
/// Backoff after a failed pool boot: doubles from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_LAST: Duration = Duration::from_secs(60);
/// How long a pooled sandbox's agent gets to end before it is killed.
const AGENT_GOODBYE: Duration = Duration::from_secs(2);
/// How long an orderly shutdown waits for pool boots in progress.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Refuses, at start-up, a `warm_pool` image that no create could boot with the defaults:
/// not in the catalog or not allowed, or its `per_image_caps` below the defaults.
pub(crate) fn check(config: &Config, images: &ImageStore) -> Result<(), String> {
    for image in config.warm_pool.keys() {
        let refuse = |reason: String| format!("configuration key `warm_pool.{image}`: {reason}");
        images
            .check_allowed(image)
            .map_err(|e| refuse(e.to_string()))?;
        let Some(caps) = config.per_image_caps.get(image) else {
            continue;
        };
        if let Some(max) = caps.max_cpus.filter(|max| config.default_cpus > *max) {
            return Err(refuse(format!(
                "`per_image_caps.{image}.max_cpus` ({max}) is below `default_cpus` ({}), which pooled sandboxes use",
                config.default_cpus
            )));
        }
        if let Some(max) = caps
            .max_memory_mb
            .filter(|max| config.default_memory_mb > *max)
        {
            return Err(refuse(format!(
                "`per_image_caps.{image}.max_memory_mb` ({max}) is below `default_memory_mb` ({}), which pooled sandboxes use",
                config.default_memory_mb
            )));
        }
    }
    Ok(())
}

/// Whether a create asking `options` may be served by a pooled sandbox (see the module).
pub(crate) fn serves(config: &Config, options: &CreateOptions) -> bool {
    config.warm_pool.contains_key(&options.image)
        && options.cpus.unwrap_or(config.default_cpus) == config.default_cpus
        && options.memory_mb.unwrap_or(config.default_memory_mb) == config.default_memory_mb
        && !options.network
        && options.network_policy.is_none()
        && options.layers.is_empty()
}

/// A booted sandbox waiting for a create; it holds one pool slot of the registry.
pub(crate) struct Pooled {
    id: Uuid,
    image: PreparedImage,
    agent: AgentClient,
    process: Box<dyn SandboxProcess>,
    layer: PathBuf,
}

#[derive(Default)]
struct PoolState {
    ready: BTreeMap<String, VecDeque<Pooled>>,
    booting: BTreeMap<String, usize>,
    /// Per image: why its last pool boot failed, and when to try again (and the next wait).
    failed: BTreeMap<String, Failure>,
    /// The adapter is shutting down: no more boots, nothing handed out.
    closed: bool,
}

struct Failure {
    reason: String,
    retry_at: Instant,
    backoff: Duration,
}

/// The pool of one adapter, and its counters (shown by `adapter::info`).
pub(crate) struct WarmPool {
    targets: BTreeMap<String, usize>,
    state: Mutex<PoolState>,
    /// Woken when the pool changes (a sandbox taken, added or gone).
    changed: Arc<Notify>,
    boots_on_create: AtomicU64,
    boots_for_pool: AtomicU64,
    handed_out: AtomicU64,
    evicted: AtomicU64,
}

impl WarmPool {
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            targets: config.warm_pool.clone(),
            state: Mutex::new(PoolState::default()),
            changed: Arc::new(Notify::new()),
            boots_on_create: AtomicU64::new(0),
            boots_for_pool: AtomicU64::new(0),
            handed_out: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, PoolState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A sandbox was booted on a create's own path.
    pub(crate) fn count_boot_on_create(&self) {
        self.boots_on_create.fetch_add(1, Ordering::Relaxed);
    }

    /// The pool per image, the handouts and evictions, for `adapter::info.warm_pool`.
    pub(crate) fn status(&self) -> Value {
        let state = self.state();
        let images: serde_json::Map<String, Value> = self
            .targets
            .iter()
            .map(|(image, target)| {
                let ready = state.ready.get(image).map_or(0, VecDeque::len);
                let booting = state.booting.get(image).copied().unwrap_or(0);
                let last_error = state.failed.get(image).map(|f| f.reason.clone());
                let entry = json!({"target": target, "ready": ready, "booting": booting, "last_error": last_error});
                (image.clone(), entry)
            })
            .collect();
        json!({
            "images": images,
            "handed_out": self.handed_out.load(Ordering::Relaxed),
            "evicted": self.evicted.load(Ordering::Relaxed),
        })
    }

    /// Sandbox boots so far, by whose path they were on (`adapter::info.boots`).
    pub(crate) fn boots(&self) -> Value {
        json!({
            "on_create": self.boots_on_create.load(Ordering::Relaxed),
            "for_warm_pool": self.boots_for_pool.load(Ordering::Relaxed),
        })
    }

    /// Removes the pooled sandbox `id` of `image`, if it is still waiting.
    fn remove(&self, image: &str, id: Uuid) -> Option<Pooled> {
        let mut state = self.state();
        let queue = state.ready.get_mut(image)?;
        let at = queue.iter().position(|p| p.id == id)?;
        queue.remove(at)
    }
}

/// Starts the refiller; it runs until the plugin is dropped. Boots one sandbox at a time.
pub(crate) fn spawn<B: Backend>(plugin: &Arc<SandboxPlugin<B>>) {
    if plugin.pool.targets.is_empty() {
        return;
    }
    let changed = Arc::clone(&plugin.pool.changed);
    let plugin = Arc::downgrade(plugin);
    tokio::spawn(async move {
        loop {
            let Some(strong) = plugin.upgrade() else {
                return;
            };
            if let Some(image) = next_to_boot(&strong) {
                refill_one(&strong, image).await;
                continue;
            }
            drop(strong);
            if tokio::time::timeout(REFILL_TICK, changed.notified())
                .await
                .is_ok()
            {
                // A change (most often a create that took a pooled sandbox): the refill's
                // boot waits a moment, so it does not compete for the CPU with that
                // caller's first requests on the sandbox just handed out.
                tokio::time::sleep(REFILL_SETTLE).await;
            }
        }
    });
}

/// The image most short of its target whose backoff is over, with a pool slot taken and its
/// boot counted as in progress; `None` when none is short or no slot is free.
fn next_to_boot<B: Backend>(plugin: &SandboxPlugin<B>) -> Option<String> {
    let pool = &plugin.pool;
    let mut state = pool.state();
    if state.closed {
        return None;
    }
    let now = Instant::now();
    let image = pool
        .targets
        .iter()
        .filter(|(image, _)| state.failed.get(*image).is_none_or(|f| now >= f.retry_at))
        .map(|(image, target)| {
            let have = state.ready.get(image).map_or(0, VecDeque::len)
                + state.booting.get(image).copied().unwrap_or(0);
            (image, target.saturating_sub(have))
        })
        .filter(|(_, short)| *short > 0)
        .max_by_key(|(_, short)| *short)
        .map(|(image, _)| image.clone())?;
    // Lock order: the pool's, then the registry's (never the other way).
    if !plugin.registry.hold_pool_slot() {
        return None;
    }
    *state.booting.entry(image.clone()).or_default() += 1;
    Some(image)
}

/// Boots one sandbox of `image` for the pool (its slot already held).
async fn refill_one<B: Backend>(plugin: &Arc<SandboxPlugin<B>>, image: String) {
    let config = &plugin.config;
    let booted = match check_host_can_boot(plugin) {
        Ok(()) => {
            let boot = Boot {
                image: &image,
                cpus: config.default_cpus,
                memory_mb: config.default_memory_mb,
                network: false,
                egress: config.egress.clone(),
                layers: &[],
                image_digest: None,
            };
            boot_sandbox(plugin, boot).await
        }
        Err(e) => Err(e),
    };
    let pool = &plugin.pool;
    // Decided under the lock, done after it (nothing awaits while it is held).
    let closed_meanwhile = {
        let mut state = pool.state();
        let state = &mut *state;
        let booting = state.booting.entry(image.clone()).or_default();
        match booted {
            Ok(fresh) => {
                pool.boots_for_pool.fetch_add(1, Ordering::Relaxed);
                state.failed.remove(&image);
                let Phases {
                    boot_ms, hello_ms, ..
                } = fresh.phases;
                let pooled = pooled_of(fresh);
                tracing::info!(sandbox_id = %pooled.id, image, boot_ms, hello_ms, "warm pool: sandbox ready");
                if state.closed {
                    // Still counted as booting until it is gone: shutdown waits for it.
                    Some(pooled)
                } else {
                    *booting = booting.saturating_sub(1);
                    watch_pooled(Arc::downgrade(plugin), &image, &pooled);
                    state
                        .ready
                        .entry(image.clone())
                        .or_default()
                        .push_back(pooled);
                    None
                }
            }
            Err(e) => {
                *booting = booting.saturating_sub(1);
                let backoff = state
                    .failed
                    .get(&image)
                    .map_or(BACKOFF_FIRST, |f| (f.backoff * 2).min(BACKOFF_LAST));
                tracing::warn!(image, error = %e, retry_in_secs = backoff.as_secs(), "warm pool: boot failed");
                state.failed.insert(
                    image.clone(),
                    Failure {
                        reason: e.to_string(),
                        retry_at: Instant::now() + backoff,
                        backoff,
                    },
                );
                plugin.registry.release_pool_slot();
                None
            }
        }
    };
    if let Some(pooled) = closed_meanwhile {
        discard(plugin, pooled).await;
        if let Some(booting) = pool.state().booting.get_mut(&image) {
            *booting = booting.saturating_sub(1);
        }
    }
    pool.changed.notify_waiters();
}

fn pooled_of(fresh: Fresh) -> Pooled {
    Pooled {
        id: fresh.id,
        image: fresh.image,
        agent: fresh.agent,
        process: fresh.process,
        layer: fresh.layer,
    }
}

/// A pooled sandbox of `image` whose agent still answers, taken out of the pool (so no other
/// create can have it); dead ones found on the way are discarded.
pub(crate) fn take<B: Backend>(plugin: &Arc<SandboxPlugin<B>>, image: &str) -> Option<Pooled> {
    loop {
        let pooled = {
            let mut state = plugin.pool.state();
            if state.closed {
                return None;
            }
            state.ready.get_mut(image)?.pop_front()?
        };
        plugin.pool.changed.notify_waiters();
        if pooled.process.is_alive() && !pooled.agent.is_closed() {
            return Some(pooled);
        }
        tracing::warn!(sandbox_id = %pooled.id, image, "warm pool: a pooled sandbox died; discarding it");
        let plugin = Arc::clone(plugin);
        tokio::spawn(async move { discard(&plugin, pooled).await });
    }
}

/// Hands a pooled sandbox to the create that asked `options`: it joins the live set now, so
/// its `created` time and idle timer start at the handout.
pub(crate) fn hand_out<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    pooled: Pooled,
    options: CreateOptions,
) -> Arc<Sandbox> {
    let fresh = Fresh {
        id: pooled.id,
        image: pooled.image,
        agent: pooled.agent,
        process: pooled.process,
        layer: pooled.layer,
        phases: Phases::start(),
    };
    let sandbox = plugin.registry.adopt(new_sandbox(plugin, fresh, options));
    crate::ops::stop::watch_agent(Arc::downgrade(plugin), &sandbox);
    plugin.events.emit(|| {
        crate::events::Event::created(
            sandbox.id,
            &sandbox.image,
            plugin.config.default_cpus,
            plugin.config.default_memory_mb,
            true,
        )
    });
    plugin
        .events
        .emit(|| crate::events::Event::ready(sandbox.id));
    plugin.pool.handed_out.fetch_add(1, Ordering::Relaxed);
    tracing::info!(sandbox_id = %sandbox.id, image = %sandbox.image, bounded = crate::ops::create::bounded(plugin), "sandbox handed out from the warm pool");
    sandbox
}

/// Frees a slot for a create that found every slot taken, by evicting a pooled sandbox
/// (another image's first; the one with the most waiting), waiting for a pool boot in
/// progress to finish when none waits yet. The slot passes straight to the create, and the
/// evicted sandbox is gone before the create boots, so the cap holds throughout. `None` when
/// the pool holds no slot.
pub(crate) async fn evict_for_create<'a, B: Backend>(
    plugin: &'a Arc<SandboxPlugin<B>>,
    asked: &str,
) -> Option<Reservation<'a>> {
    let deadline = tokio::time::Instant::now() + AGENT_HELLO_TIMEOUT + Duration::from_secs(10);
    loop {
        let changed = plugin.pool.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if let Ok(reservation) = plugin.registry.reserve() {
            return Some(reservation);
        }
        let (victim, booting) = {
            let mut state = plugin.pool.state();
            let image = state
                .ready
                .iter()
                .filter(|(_, queue)| !queue.is_empty())
                .max_by_key(|(image, queue)| (image.as_str() != asked, queue.len()))
                .map(|(image, _)| image.clone());
            let victim = image.and_then(|image| state.ready.get_mut(&image)?.pop_back());
            (victim, state.booting.values().sum::<usize>())
        };
        if let Some(victim) = victim {
            let reservation = plugin.registry.pool_slot_for_create();
            plugin.pool.evicted.fetch_add(1, Ordering::Relaxed);
            tracing::info!(sandbox_id = %victim.id, "warm pool: evicted for a create at max_concurrent_sandboxes");
            teardown(plugin, victim).await;
            return Some(reservation);
        }
        if booting == 0 {
            return None;
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            return None;
        }
    }
}

/// Watches a pooled sandbox's agent: if it goes away while the sandbox waits in the pool, the
/// sandbox is discarded (and the refiller boots another). Once handed out, `watch_agent` of
/// the live sandbox takes over and this one finds nothing to do.
fn watch_pooled<B: Backend>(plugin: Weak<SandboxPlugin<B>>, image: &str, pooled: &Pooled) {
    let agent = pooled.agent.clone();
    let (image, id) = (image.to_string(), pooled.id);
    tokio::spawn(async move {
        let cause = agent.closed().await;
        drop(agent);
        let Some(plugin) = plugin.upgrade() else {
            return;
        };
        if let Some(pooled) = plugin.pool.remove(&image, id) {
            tracing::warn!(sandbox_id = %id, image, cause, "warm pool: a pooled sandbox's agent is gone; discarding it");
            discard(&plugin, pooled).await;
            plugin.pool.changed.notify_waiters();
        }
    });
}

/// Ends a pooled sandbox: its agent, its process, its layer. Its slot is the caller's.
async fn teardown<B: Backend>(plugin: &SandboxPlugin<B>, pooled: Pooled) {
    let _ = tokio::time::timeout(AGENT_GOODBYE, pooled.agent.shutdown()).await;
    pooled.process.kill().await;
    plugin.state.remove_layer(&plugin.backend, &pooled.layer);
    tracing::debug!(sandbox_id = %pooled.id, "warm pool: sandbox stopped");
}

/// Ends a pooled sandbox and gives its slot back.
async fn discard<B: Backend>(plugin: &SandboxPlugin<B>, pooled: Pooled) {
    teardown(plugin, pooled).await;
    plugin.registry.release_pool_slot();
}

/// The adapter is going away: no more boots or handouts; waits (bounded) for the boots in
/// progress, then stops every pooled sandbox.
pub(crate) async fn shutdown<B: Backend>(plugin: &SandboxPlugin<B>) {
    let deadline = tokio::time::Instant::now() + SHUTDOWN_WAIT;
    plugin.pool.state().closed = true;
    loop {
        let changed = plugin.pool.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if plugin.pool.state().booting.values().sum::<usize>() == 0 {
            break;
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            break;
        }
    }
    let waiting: Vec<Pooled> = {
        let mut state = plugin.pool.state();
        std::mem::take(&mut state.ready)
            .into_values()
            .flatten()
            .collect()
    };
    futures::future::join_all(waiting.into_iter().map(|p| discard(plugin, p))).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(value: Value) -> Config {
        Config::from_json(&value).unwrap()
    }

    #[test]
    fn pool_slots_count_against_the_cap_and_pass_to_a_create() {
        let registry = crate::registry::Registry::new(2);
        assert!(registry.hold_pool_slot());
        assert!(registry.hold_pool_slot());
        assert!(!registry.hold_pool_slot(), "the cap holds for the pool");
        assert!(registry.reserve().is_err(), "and for creates");
        let occupancy = registry.occupancy();
        assert_eq!((occupancy.in_flight, occupancy.pooled), (0, 2));
        let reservation = registry.pool_slot_for_create();
        let occupancy = registry.occupancy();
        assert_eq!((occupancy.in_flight, occupancy.pooled), (1, 1));
        assert!(!registry.hold_pool_slot(), "the slot passed, none freed");
        drop(reservation); // the create failed: its slot is free
        assert!(registry.hold_pool_slot());
        registry.release_pool_slot();
        registry.release_pool_slot();
        assert_eq!(registry.occupancy().pooled, 0);
        assert!(registry.reserve().is_ok());
    }

    #[test]
    fn only_a_create_asking_the_boot_defaults_of_a_pooled_image_is_served() {
        let config = config(
            json!({"warm_pool": {"python": 1}, "default_cpus": 1, "default_memory_mb": 512}),
        );
        let ask = |image: &str| CreateOptions {
            image: image.into(),
            ..Default::default()
        };
        assert!(serves(&config, &ask("python")));
        let host_side = CreateOptions {
            name: Some("n".into()),
            env: vec![("K".into(), "V".into())],
            idle_timeout_secs: Some(5),
            cpus: Some(1),
            memory_mb: Some(512),
            ..ask("python")
        };
        assert!(
            serves(&config, &host_side),
            "name, env, idle timeout and explicit defaults match"
        );
        assert!(!serves(&config, &ask("node")), "not pooled");
        for other in [
            CreateOptions {
                cpus: Some(2),
                ..ask("python")
            },
            CreateOptions {
                memory_mb: Some(256),
                ..ask("python")
            },
            CreateOptions {
                network: true,
                ..ask("python")
            },
            CreateOptions {
                network: true,
                network_policy: Some(json!({"allow": []})),
                ..ask("python")
            },
        ] {
            assert!(!serves(&config, &other), "{other:?}");
        }
    }
}
