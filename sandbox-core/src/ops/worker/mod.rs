//! `worker::*` (SPEC.md section 6): long-lived worker VMs that Compose runs its `package://`
//! and `path://` workers in. Every call arrives token-checked by the shell, `auth` removed.
//!
//! A worker VM is a sandbox booted by the same backend as any other, but it is not counted
//! against `max_concurrent_sandboxes`, never idle-reaped, not listed by `list`, and its root
//! overlay's writable layer persists under `<state_dir>/workers/<vm_id>/` (see [`record`]).
//! The guest sees the host directory read-only at `/worker` (minus the Compose file) and its
//! own `data/` read-write at `/state`; its program runs as one exec without timeout, and the
//! adapter appends the output streamed back by the agent to `logs/worker.log`, a directory
//! no guest sees (opened without following links: see [`safe_fs`]), rotated into
//! `worker.log.1` while it is written (the `bounded-log` crate: never more than 4 MiB).
//!
//! Each VM's operations are serialised by a per-`vm_id` lock; `status` and `logs` only read.

mod compose_file;
mod guest_env;
mod lifecycle;
mod record;
mod roots;
mod safe_fs;
pub mod schema;
mod tree;
mod tuning;

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::request::{env_pairs, guest_path, parse};
pub use compose_file::{DEFAULT_COMPOSE_FILE, WORKER_MANIFEST};
use guest_env::TokenFilter;
use lifecycle::Run;
use record::{check_vm_id, WorkerDirs, WorkerRecord, WorkerState};
pub use roots::{
    HostRoots, RootSources, COMPOSE_DIR_ENV, COMPOSE_FILE_ENV, COMPOSE_FILE_NAMES,
    COMPOSE_STATE_DIR_ENV, COMPOSE_STATE_DIR_NAME, WORKER_DIRS_ENV,
};
pub use tuning::{
    shown as shown_env_value, TuningSupport, VmTuning, DEFAULT_NOFILE_LIMIT, HYPERTHREADING_ENV,
    NESTED_VIRT_ENV, NOFILE_LIMIT_ENV, VIRTIOFS_SHM_SIZE_ENV,
};

/// `logs` returns this many bytes unless asked otherwise, and never more than the cap.
const DEFAULT_LOG_BYTES: u64 = 64 * 1024;
const MAX_LOG_BYTES: u64 = 1024 * 1024;
/// `stop` waits this long for the program to exit after SIGTERM unless asked otherwise.
const DEFAULT_STOP_TIMEOUT_MS: u64 = 10_000;

/// The worker VMs of one adapter run.
pub struct Workers {
    dirs: WorkerDirs,
    roots: HostRoots,
    token: TokenFilter,
    /// The `III_VM_*` tuning, for `status` (the backend applies it to worker VMs' boots).
    tuning: VmTuning,
    runs: Mutex<HashMap<String, Arc<Run>>>,
    op_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Held around each read-modify-write of a `worker.json`.
    record_lock: Mutex<()>,
}

impl Workers {
    /// Reads the roots and the token (to filter it) from the environment.
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        Ok(Self {
            dirs: WorkerDirs::open(state_dir)?,
            roots: HostRoots::from_env(),
            token: TokenFilter::from_env(),
            tuning: VmTuning::get(),
            runs: Mutex::default(),
            op_locks: Mutex::default(),
            record_lock: Mutex::default(),
        })
    }

    /// A `vm_id` the guest may see (as `III_WORKER_VM_ID`, in paths and logs): a bounded
    /// identifier, never the worker token (refused without saying what it was).
    fn check_vm_id(&self, vm_id: &str) -> Result<(), SandboxError> {
        if self.token.mentions(vm_id) {
            return Err(SandboxError::InvalidRequest(
                "`vm_id` holds the worker token, which never enters a guest: choose another id"
                    .into(),
            ));
        }
        check_vm_id(vm_id)
    }

    fn op_lock(&self, vm_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.op_locks).entry(vm_id.to_string()).or_default())
    }

    fn run(&self, vm_id: &str) -> Option<Arc<Run>> {
        lock(&self.runs).get(vm_id).cloned()
    }

    fn load(&self, vm_id: &str) -> Result<WorkerRecord, SandboxError> {
        self.dirs
            .load(vm_id)
            .map_err(|e| internal(vm_id, "read the state of", e))?
            .ok_or_else(|| {
                SandboxError::UnknownSandbox(format!(
                    "worker VM `{vm_id}` (never prepared: call worker::prepare first)"
                ))
            })
    }

    fn save(&self, record: &WorkerRecord) -> Result<(), SandboxError> {
        let _guard = lock(&self.record_lock);
        self.dirs
            .save(record)
            .map_err(|e| internal(&record.vm_id, "write the state of", e))
    }

    /// Loads, changes and saves a record, if it still exists.
    fn update(&self, vm_id: &str, change: impl FnOnce(&mut WorkerRecord)) {
        let _guard = lock(&self.record_lock);
        if let Ok(Some(mut record)) = self.dirs.load(vm_id) {
            change(&mut record);
            if let Err(e) = self.dirs.save(&record) {
                tracing::warn!(vm_id, error = %e, "cannot record a worker VM's state");
            }
        }
    }
}

pub async fn dispatch<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    op: &str,
    payload: Value,
) -> Result<Value, SandboxError> {
    match op {
        "prepare" => prepare(plugin, parse(payload)?).await,
        "start" => start(plugin, parse(payload)?).await,
        "status" => status(plugin, parse(payload)?),
        "logs" => logs(plugin, parse(payload)?),
        "stop" => stop(plugin, parse(payload)?).await,
        "destroy" => destroy(plugin, parse(payload)?).await,
        other => Err(SandboxError::InvalidRequest(format!(
            "unknown function `worker::{other}`"
        ))),
    }
}

#[derive(Debug, Deserialize)]
struct PrepareRequest {
    vm_id: String,
    image: String,
    host_path: String,
    cpus: Option<u32>,
    memory_mb: Option<u32>,
}

async fn prepare<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    request: PrepareRequest,
) -> Result<Value, SandboxError> {
    let workers = &plugin.workers;
    plugin.workers.check_vm_id(&request.vm_id)?;
    if request.image.trim().is_empty() {
        return Err(SandboxError::InvalidRequest("`image` is empty".into()));
    }
    if request.cpus == Some(0) {
        return Err(SandboxError::InvalidRequest(
            "`cpus` must be at least 1".into(),
        ));
    }
    if request.memory_mb.is_some_and(|m| m < 16) {
        return Err(SandboxError::InvalidRequest(
            "`memory_mb` must be at least 16".into(),
        ));
    }
    crate::ops::create::check_image_caps(
        plugin,
        &request.image,
        request.cpus.unwrap_or(plugin.config.default_cpus),
        request.memory_mb.unwrap_or(plugin.config.default_memory_mb),
    )?;
    plugin
        .images
        .check_allowed(&request.image)
        .map_err(crate::images::error)?;
    workers.roots.check(&request.host_path)?;

    let vm_id = request.vm_id.clone();
    let op_lock = workers.op_lock(&vm_id);
    let _serialised = op_lock.lock().await;
    let existing = workers.dirs.load(&vm_id).ok().flatten();
    let changed = existing
        .as_ref()
        .is_some_and(|r| r.image != request.image || r.host_path != request.host_path);
    if changed && workers.run(&vm_id).is_some() {
        return Err(SandboxError::InvalidRequest(format!(
            "worker VM `{vm_id}` is running with another image or host_path: stop it first"
        )));
    }
    plugin
        .images
        .ensure(&request.image)
        .await
        .map_err(crate::images::error)?;
    workers
        .dirs
        .create(&vm_id)
        .map_err(|e| internal(&vm_id, "create the state directory of", e))?;
    let record = match existing {
        Some(mut record) => {
            record.image = request.image;
            record.host_path = request.host_path;
            record.cpus = request.cpus;
            record.memory_mb = request.memory_mb;
            record
        }
        None => WorkerRecord {
            vm_id: vm_id.clone(),
            image: request.image,
            host_path: request.host_path,
            cpus: request.cpus,
            memory_mb: request.memory_mb,
            state: WorkerState::Prepared,
            command: Vec::new(),
            env: Vec::new(),
            workdir: None,
            started_at: None,
            exit_code: None,
            error: None,
        },
    };
    workers.save(&record)?;
    tracing::info!(vm_id, image = %record.image, "worker VM prepared");
    Ok(json!({
        "vm_id": vm_id,
        "state": record.state,
        "state_dir": workers.dirs.dir(&vm_id).display().to_string(),
    }))
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    vm_id: String,
    command: Vec<String>,
    env: Option<Value>,
    workdir: Option<String>,
}

async fn start<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    request: StartRequest,
) -> Result<Value, SandboxError> {
    let workers = &plugin.workers;
    plugin.workers.check_vm_id(&request.vm_id)?;
    let command = request.command;
    match command.first() {
        None => return Err(SandboxError::InvalidRequest("`command` is empty".into())),
        Some(program) if program.is_empty() => {
            return Err(SandboxError::InvalidRequest(
                "the program name is empty".into(),
            ))
        }
        _ => {}
    }
    if command.iter().any(|a| a.contains('\0')) {
        return Err(SandboxError::InvalidRequest(
            "`command` contains a NUL byte".into(),
        ));
    }
    let workdir = request.workdir.unwrap_or_else(|| "/worker".into());
    guest_path("workdir", &workdir)?;
    // Never echo what matched: that would be the token.
    if command.iter().any(|a| workers.token.mentions(a)) || workers.token.mentions(&workdir) {
        return Err(SandboxError::InvalidRequest(
            "`command` or `workdir` holds the worker token, which never enters a guest".into(),
        ));
    }
    let env = workers.token.clean(env_pairs(request.env)?);

    let vm_id = request.vm_id;
    let op_lock = workers.op_lock(&vm_id);
    let _serialised = op_lock.lock().await;
    let mut record = workers.load(&vm_id)?;
    if let Some(run) = workers.run(&vm_id) {
        if !run.program_ended() {
            return Ok(status_json(plugin, &record, Some(&run)));
        }
        // Its program just ended: let the teardown finish, then start afresh.
        run.wait_done(Duration::from_secs(30)).await;
        record = workers.load(&vm_id)?;
    }
    record.command = command;
    record.env = env;
    record.workdir = Some(workdir);
    lifecycle::launch(plugin, &mut record).await?;
    Ok(status_json(plugin, &record, workers.run(&vm_id).as_deref()))
}

#[derive(Debug, Deserialize)]
struct VmRequest {
    vm_id: String,
}

fn status<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    request: VmRequest,
) -> Result<Value, SandboxError> {
    plugin.workers.check_vm_id(&request.vm_id)?;
    let record = plugin.workers.load(&request.vm_id)?;
    let run = plugin.workers.run(&request.vm_id);
    Ok(status_json(plugin, &record, run.as_deref()))
}

fn status_json<B: Backend>(
    plugin: &SandboxPlugin<B>,
    record: &WorkerRecord,
    run: Option<&Run>,
) -> Value {
    let mut status = json!({
        "vm_id": record.vm_id,
        "state": record.state,
        "image": record.image,
        "host_path": record.host_path,
        "vm_tuning": plugin
            .workers
            .tuning
            .status(plugin.backend.name(), plugin.backend.worker_tuning()),
    });
    let pid = run
        .filter(|_| record.state == WorkerState::Running)
        .and_then(Run::pid);
    let optional = [
        ("pid", pid.map(Value::from)),
        ("exit_code", record.exit_code.map(Value::from)),
        ("started_at", record.started_at.clone().map(Value::from)),
        ("error", record.error.clone().map(Value::from)),
    ];
    for (key, value) in optional {
        if let Some(value) = value {
            status[key] = value;
        }
    }
    status
}

#[derive(Debug, Deserialize)]
struct LogsRequest {
    vm_id: String,
    max_bytes: Option<u64>,
}

fn logs<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    request: LogsRequest,
) -> Result<Value, SandboxError> {
    plugin.workers.check_vm_id(&request.vm_id)?;
    let max_bytes = match request.max_bytes {
        Some(0) => {
            return Err(SandboxError::InvalidRequest(
                "`max_bytes` must be at least 1".into(),
            ))
        }
        Some(n) => n.min(MAX_LOG_BYTES),
        None => DEFAULT_LOG_BYTES,
    };
    plugin.workers.load(&request.vm_id)?;
    let path = plugin.workers.dirs.log_file(&request.vm_id);
    let (content, truncated) = bounded_log::tail(&path, max_bytes)
        .map_err(|e| internal(&request.vm_id, "read the log of", e))?;
    Ok(json!({
        "vm_id": request.vm_id,
        "content": String::from_utf8_lossy(&content),
        "truncated": truncated,
    }))
}

#[derive(Debug, Deserialize)]
struct StopRequest {
    vm_id: String,
    timeout_ms: Option<u64>,
}

async fn stop<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    request: StopRequest,
) -> Result<Value, SandboxError> {
    let workers = &plugin.workers;
    plugin.workers.check_vm_id(&request.vm_id)?;
    let timeout = Duration::from_millis(request.timeout_ms.unwrap_or(DEFAULT_STOP_TIMEOUT_MS));
    let vm_id = request.vm_id;
    let op_lock = workers.op_lock(&vm_id);
    let _serialised = op_lock.lock().await;
    let mut record = workers.load(&vm_id)?;
    if let Some(run) = workers.run(&vm_id) {
        lifecycle::stop_run(&run, timeout).await;
        record = workers.load(&vm_id)?;
    }
    // Prepared, exited and failed VMs stay as they were: nothing runs, and their exit code
    // or error is worth keeping.
    if record.state == WorkerState::Running {
        record.state = WorkerState::Stopped;
        workers.save(&record)?;
        tracing::info!(vm_id, "worker VM stopped");
    }
    Ok(json!({ "vm_id": vm_id, "state": record.state }))
}

async fn destroy<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    request: VmRequest,
) -> Result<Value, SandboxError> {
    let workers = &plugin.workers;
    plugin.workers.check_vm_id(&request.vm_id)?;
    let vm_id = request.vm_id;
    let op_lock = workers.op_lock(&vm_id);
    let _serialised = op_lock.lock().await;
    if let Some(run) = workers.run(&vm_id) {
        lifecycle::stop_run(&run, Duration::from_millis(DEFAULT_STOP_TIMEOUT_MS)).await;
    }
    plugin.backend.release_layer(&workers.dirs.layer(&vm_id));
    let destroyed = {
        let _guard = lock(&workers.record_lock);
        workers
            .dirs
            .remove(&vm_id, |dir| plugin.backend.remove_guest_tree(dir))
            .map_err(|e| internal(&vm_id, "delete the state directory of", e))?
    };
    // Forget the lock unless another call waits on it (it holds a clone): it must keep
    // serialising with whoever comes next.
    let mut op_locks = lock(&workers.op_locks);
    if op_locks
        .get(&vm_id)
        .is_some_and(|l| Arc::strong_count(l) <= 2)
    {
        op_locks.remove(&vm_id);
    }
    drop(op_locks);
    if destroyed {
        tracing::info!(vm_id, "worker VM destroyed");
    }
    Ok(json!({ "vm_id": vm_id, "destroyed": destroyed }))
}

/// Starts again, in the background, every worker VM that was running when an earlier run of
/// the adapter ended (its record still says `running`).
pub fn restart_all<B: Backend>(plugin: &Arc<SandboxPlugin<B>>) {
    let workers = &plugin.workers;
    let due: Vec<String> = workers
        .dirs
        .ids()
        .into_iter()
        .filter(|id| {
            workers
                .dirs
                .load(id)
                .ok()
                .flatten()
                .is_some_and(|r| r.state == WorkerState::Running)
        })
        .collect();
    if due.is_empty() {
        return;
    }
    tracing::info!(count = due.len(), "restarting worker VMs");
    let plugin = Arc::clone(plugin);
    tokio::spawn(async move {
        for vm_id in due {
            let op_lock = plugin.workers.op_lock(&vm_id);
            let _serialised = op_lock.lock().await;
            let Ok(mut record) = plugin.workers.load(&vm_id) else {
                continue;
            };
            if record.state != WorkerState::Running || plugin.workers.run(&vm_id).is_some() {
                continue; // stopped or started by a call meanwhile
            }
            if let Err(e) = lifecycle::launch(&plugin, &mut record).await {
                tracing::warn!(vm_id, error = %e, "a worker VM did not restart");
            }
        }
    });
}

/// Kills every worker VM (the adapter is going away); their records keep saying `running`,
/// so the next start of the adapter starts them again.
pub async fn shutdown<B: Backend>(plugin: &SandboxPlugin<B>) {
    let runs: Vec<Arc<Run>> = lock(&plugin.workers.runs).values().cloned().collect();
    futures::future::join_all(runs.iter().map(|run| lifecycle::kill_run(plugin, run))).await;
}

fn internal(vm_id: &str, what: &str, error: io::Error) -> SandboxError {
    SandboxError::Internal(format!("cannot {what} worker VM `{vm_id}`: {error}"))
}

/// A poisoned lock only means another call panicked while holding it; the maps are still
/// usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_id_holding_the_token_is_refused_without_echoing_it() {
        let state = tempfile::tempdir().unwrap();
        let mut workers = Workers::open(state.path()).unwrap();
        let token = "tok-0123456789abcdef";
        workers.token = TokenFilter::new(Some(token.into()));
        assert!(workers.check_vm_id("api-1").is_ok());
        for bad in [
            token.to_string(),
            format!("w-{token}"),
            token.to_uppercase(),
        ] {
            let error = workers.check_vm_id(&bad).unwrap_err();
            assert_eq!(error.code(), "S001", "{bad}");
            let message = error.to_string();
            assert!(!message.to_lowercase().contains(token), "{message}");
        }
        let long = "w".repeat(100_000);
        let error = workers.check_vm_id(&long).unwrap_err();
        assert!(error.to_string().len() < 200, "{error}");
    }
}
