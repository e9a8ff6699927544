//! Booting a worker VM, running its program, and ending it: gracefully on `stop`, at once
//! when the adapter goes away, and by itself when the program exits.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_proto::client::{AgentClient, AgentError, OutputChunk};
use agent_proto::{ExecExit, ExecSpec};
use bounded_log::{BoundedFile, Start};
use bus_guard::SandboxBus;
use tokio::sync::{mpsc, watch};

use super::guest_env::{guest_env, NAMESPACE_ENV};
use super::record::{now_rfc3339, WorkerRecord, WorkerState};
use super::safe_fs;
use super::tree::read_only_tree;
use crate::backend::{Backend, BootSpec, GuestMount, SandboxProcess};
use crate::error::SandboxError;
use crate::ops::create::{check_image_caps, AGENT_HELLO_TIMEOUT};
use crate::plugin::SandboxPlugin;

/// Where the guest finds the host directory (read-only) and its state. The log is not among
/// them: the adapter writes it from the program's output, where no guest can reach it.
pub const WORKER_DIR: &str = "/worker";
pub const STATE_DIR: &str = "/state";
/// Output chunks on their way to the log (each one frame: at most 1 MiB, 256 KiB from today's
/// agent); a full channel holds up the program's output in the agent, so the adapter never
/// holds more than this many (plus one waiting for room).
const LOG_CHANNEL_CHUNKS: usize = 8;
/// How long the agent gets to end its programs before the VM is killed.
const AGENT_GOODBYE: Duration = Duration::from_secs(2);
/// How long a teardown may take once the VM is killed.
const TEARDOWN_LIMIT: Duration = Duration::from_secs(30);

/// One boot of a worker VM.
pub struct Run {
    agent: AgentClient,
    process: Box<dyn SandboxProcess>,
    layer: PathBuf,
    /// The VM's endpoint of the bus guard: its only way to the engine, closed (ending every
    /// connection of the worker, so the engine drops its functions) at teardown.
    bus: Mutex<Option<SandboxBus>>,
    /// A caller (stop, destroy, shutdown) settles the record: the program's end does not.
    stop_requested: AtomicBool,
    program_ended: AtomicBool,
    /// Becomes true once the VM is torn down.
    done: watch::Sender<bool>,
}

impl Run {
    /// The host process holding the VM.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Ends the VM's bus endpoint and its connections (once; later calls do nothing).
    fn close_bus(&self) {
        let bus = self
            .bus
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        drop(bus);
    }

    pub fn program_ended(&self) -> bool {
        self.program_ended.load(Ordering::SeqCst)
    }

    /// Waits up to `limit` for the teardown; whether it happened.
    pub async fn wait_done(&self, limit: Duration) -> bool {
        let mut done = self.done.subscribe();
        let waited = tokio::time::timeout(limit, done.wait_for(|d| *d)).await;
        waited.is_ok()
    }
}

/// Boots `record`'s VM and starts its program; the record says `running` on success and
/// `failed` (with the reason) on failure, and is saved either way.
pub async fn launch<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    record: &mut WorkerRecord,
) -> Result<(), SandboxError> {
    match boot(plugin, record).await {
        Ok(()) => {
            tracing::info!(vm_id = %record.vm_id, image = %record.image, "worker VM started");
            plugin
                .events
                .emit(|| crate::events::Event::worker_started(&record.vm_id, &record.image));
            Ok(())
        }
        Err(e) => {
            record.state = WorkerState::Failed;
            record.error = Some(e.to_string());
            plugin.workers.save(record)?;
            Err(e)
        }
    }
}

async fn boot<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    record: &mut WorkerRecord,
) -> Result<(), SandboxError> {
    let workers = &plugin.workers;
    let vm_id = record.vm_id.clone();
    let host = workers.roots.check(&record.host_path)?;
    let cpus = record.cpus.unwrap_or(plugin.config.default_cpus);
    let memory_mb = record.memory_mb.unwrap_or(plugin.config.default_memory_mb);
    check_image_caps(plugin, &record.image, cpus, memory_mb)?;
    plugin
        .images
        .check_allowed(&record.image)
        .map_err(crate::images::error)?;
    crate::ops::create::check_host_can_boot(plugin)?;
    let image = plugin
        .images
        .ensure(&record.image)
        .await
        .map_err(crate::images::error)?;
    let boot_error = |what: &str, e: io::Error| SandboxError::BootFailed(format!("{what}: {e}"));
    workers
        .dirs
        .create(&vm_id)
        .map_err(|e| boot_error("cannot create the worker's state directory", e))?;
    let log = open_log(&vm_id, &workers.dirs.log_file(&vm_id))
        .map_err(|e| boot_error("cannot open the worker's log", e))?;
    let layer = workers.dirs.layer(&vm_id);
    // What an adapter that died (kill -9) may have left of this VM's last boot.
    crate::layer::kill_recorded_process(&layer);
    plugin.backend.release_layer(&layer);

    // Decided now, not at adapter start: a Compose file written since is hidden too.
    let mut mounts = read_only_tree(&host, WORKER_DIR, &workers.roots.hidden())
        .map_err(|e| boot_error(&format!("cannot read {}", host.display()), e))?;
    mounts.push(GuestMount::State {
        host: workers.dirs.data(&vm_id),
        guest: STATE_DIR.into(),
    });
    let namespace = record
        .env
        .iter()
        .find(|(name, _)| name == NAMESPACE_ENV)
        .map(|(_, value)| value.as_str());
    let (bus_line, bus, guest_url) = plugin.buses.worker_endpoint(&vm_id, namespace)?;
    let spec = BootSpec {
        sandbox_id: format!("worker-{vm_id}"),
        image_root: image.rootfs.clone(),
        layer_dir: layer.clone(),
        cpus,
        memory_mb,
        pids: plugin.config.max_pids_per_sandbox,
        disk_mb: plugin.config.default_disk_mb,
        network: true,
        // The guard's endpoint, never the engine itself, wherever the engine is.
        egress: crate::network::Egress {
            bus: None,
            bus_guard: Some(bus_line),
            ..plugin.config.egress.clone()
        },
        agent_path: plugin.agent_path.clone(),
        mounts,
        persistent_layer: true,
        snapshot_layers: Vec::new(),
    };
    spec.check()?;
    let booted = plugin.backend.boot(&spec).await?;
    if let Some(pid) = booted.process.pid() {
        plugin.state.record_process(&layer, pid);
    }
    let hello = tokio::time::timeout(
        AGENT_HELLO_TIMEOUT,
        AgentClient::connect(booted.reader, booted.writer),
    )
    .await;
    let agent = match hello {
        Ok(Ok(agent)) => agent,
        failure => {
            booted.process.kill().await;
            let logs = plugin.backend.boot_logs(&layer);
            plugin.backend.release_layer(&layer);
            let cause = match failure {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {} s", AGENT_HELLO_TIMEOUT.as_secs()),
            };
            return Err(SandboxError::BootFailed(format!(
                "the worker VM's agent did not start: {cause}{logs}"
            )));
        }
    };

    let program = ExecSpec {
        argv: record.command.clone(),
        env: guest_env(&image.config.env, &record.env, &vm_id, &guest_url),
        workdir: record.workdir.clone().or_else(|| Some(WORKER_DIR.into())),
        stdin: Vec::new(),
        // An internal call: no deadline, and all of the output, streamed into the log.
        timeout_ms: 0,
        max_output_bytes: usize::MAX,
        tty: None,
    };
    let run = Arc::new(Run {
        agent,
        process: booted.process,
        layer,
        bus: Mutex::new(Some(bus)),
        stop_requested: AtomicBool::new(false),
        program_ended: AtomicBool::new(false),
        done: watch::channel(false).0,
    });
    record.state = WorkerState::Running;
    record.started_at = Some(now_rfc3339());
    record.exit_code = None;
    record.error = None;
    if let Err(e) = workers.save(record) {
        kill_run(plugin, &run).await;
        return Err(e);
    }
    super::lock(&workers.runs).insert(vm_id.clone(), Arc::clone(&run));
    let plugin = Arc::clone(plugin);
    tokio::spawn(async move {
        let (sink, chunks) = mpsc::channel(LOG_CHANNEL_CHUNKS);
        let (outcome, ()) = tokio::join!(
            run.agent.exec_streaming(program, sink),
            write_log(log, chunks)
        );
        finish(&plugin, &vm_id, &run, outcome).await;
    });
    Ok(())
}

/// The worker's log, ready for this boot's output after the earlier boots' (see the
/// `bounded-log` crate: `worker.log` and `worker.log.1`, each at most [`bounded_log::LIMIT`]
/// bytes, rotated while the program writes, never more than [`bounded_log::CEILING`]).
/// Whatever is not a regular file where it should be (a link left by an older version, which
/// let the guest write `logs/`) is removed, never followed.
fn open_log(vm_id: &str, path: &Path) -> io::Result<BoundedFile> {
    if safe_fs::remove_unless_regular(path)? {
        tracing::warn!(vm_id, "a worker VM's log was not a regular file: replaced");
    }
    BoundedFile::open(path, bounded_log::LIMIT, Start::Append)
}

/// Appends the program's output to its log as it arrives, stdout and stderr in the order they
/// came; returns once the exec's output has ended. Written in place, like every bounded log's
/// pipe (a chunk is at most a frame, into the page cache); a log that cannot be written (a
/// full disk) drops the rest and says so once.
async fn write_log(mut log: BoundedFile, mut chunks: mpsc::Receiver<OutputChunk>) {
    while let Some(chunk) = chunks.recv().await {
        let (OutputChunk::Stdout(data) | OutputChunk::Stderr(data)) = chunk;
        log.write(&data);
    }
}

/// The program ended (or its VM died): tear the VM down and, unless a caller is settling it,
/// record how it ended.
async fn finish<B: Backend>(
    plugin: &SandboxPlugin<B>,
    vm_id: &str,
    run: &Arc<Run>,
    outcome: Result<ExecExit, AgentError>,
) {
    run.program_ended.store(true, Ordering::SeqCst);
    teardown(plugin, run).await;
    plugin.events.emit(|| {
        crate::events::Event::worker_exited(
            vm_id,
            outcome.as_ref().ok().map(|exit| exit.exit_code),
            run.stop_requested.load(Ordering::SeqCst),
        )
    });
    if !run.stop_requested.load(Ordering::SeqCst) {
        let (state, exit_code, error) = match outcome {
            Ok(exit) => (WorkerState::Exited, Some(exit.exit_code), None),
            // The VM's own logs say why (its runner's exit, the guest console's last words),
            // read once the runner is gone.
            Err(e) => (
                WorkerState::Failed,
                None,
                Some(format!(
                    "the worker VM ended under its program: {e}{}",
                    plugin.backend.boot_logs(&run.layer)
                )),
            ),
        };
        tracing::info!(
            vm_id,
            ?state,
            ?exit_code,
            error = error.as_deref().unwrap_or(""),
            "worker VM's program ended"
        );
        plugin.workers.update(vm_id, |record| {
            record.state = state;
            record.exit_code = exit_code;
            record.error = error;
        });
    }
    let mut runs = super::lock(&plugin.workers.runs);
    if runs.get(vm_id).is_some_and(|r| Arc::ptr_eq(r, run)) {
        runs.remove(vm_id);
    }
    drop(runs);
    run.done.send_replace(true);
}

async fn teardown<B: Backend>(plugin: &SandboxPlugin<B>, run: &Run) {
    let _ = tokio::time::timeout(AGENT_GOODBYE, run.agent.shutdown()).await;
    run.process.kill().await;
    run.close_bus();
    plugin.backend.release_layer(&run.layer);
    crate::layer::kill_recorded_process(&run.layer);
}

/// `stop`: SIGTERM to every process of the guest but its init (the agent), up to `timeout`
/// for the program to exit, then the VM is killed. Returns once it is torn down.
pub async fn stop_run(run: &Run, timeout: Duration) {
    run.stop_requested.store(true, Ordering::SeqCst);
    if !run.program_ended() {
        let term = ExecSpec {
            argv: ["/bin/sh", "-c", "kill -TERM -1"]
                .map(String::from)
                .to_vec(),
            env: vec![("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())],
            workdir: Some("/".into()),
            stdin: Vec::new(),
            timeout_ms: 5_000,
            max_output_bytes: 4096,
            tty: None,
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), run.agent.exec(term)).await;
    }
    if !run.wait_done(timeout).await {
        run.process.kill().await;
        run.wait_done(TEARDOWN_LIMIT).await;
    }
}

/// Kills a worker VM without settling its record (the adapter is going away). Its agent
/// first gets a moment to end its programs and write its filesystem out (a VM whose layer is
/// its own disk holds its last writes in memory).
pub async fn kill_run<B: Backend>(plugin: &SandboxPlugin<B>, run: &Run) {
    run.stop_requested.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(AGENT_GOODBYE, run.agent.shutdown()).await;
    run.process.kill().await;
    run.close_bus();
    plugin.backend.release_layer(&run.layer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_opened_at_a_start_replaces_a_link_and_appends_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("canary");
        std::fs::write(&canary, b"host file").unwrap();
        let log = dir.path().join("worker.log");
        std::os::unix::fs::symlink(&canary, &log).unwrap();
        open_log("w", &log).unwrap().write(b"one\n");
        open_log("w", &log).unwrap().write(b"two\n");
        assert_eq!(std::fs::read(&log).unwrap(), b"one\ntwo\n");
        assert_eq!(std::fs::read(&canary).unwrap(), b"host file");
    }

    #[tokio::test]
    async fn the_log_gets_both_streams_in_arrival_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("worker.log");
        let (sink, chunks) = mpsc::channel(1);
        let file = open_log("w", &log).unwrap();
        let writer = tokio::spawn(write_log(file, chunks));
        for chunk in [
            OutputChunk::Stdout(b"out1 ".to_vec()),
            OutputChunk::Stderr(b"err1 ".to_vec()),
            OutputChunk::Stdout(b"out2".to_vec()),
        ] {
            sink.send(chunk).await.unwrap();
        }
        drop(sink);
        writer.await.unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"out1 err1 out2");
    }

    #[tokio::test]
    async fn a_flood_of_output_keeps_the_log_within_its_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("worker.log");
        let (sink, chunks) = mpsc::channel(1);
        let writer = tokio::spawn(write_log(open_log("w", &log).unwrap(), chunks));
        for n in 0..40 {
            let mut chunk = vec![b'x'; 256 << 10];
            chunk.extend_from_slice(format!("chunk {n}\n").as_bytes());
            sink.send(OutputChunk::Stdout(chunk)).await.unwrap();
        }
        drop(sink);
        writer.await.unwrap();
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        let older = bounded_log::rotated(&log);
        assert!(size(&log) + size(&older) <= bounded_log::CEILING);
        let (tail, cut) = bounded_log::tail(&log, 9).unwrap();
        assert_eq!((tail.as_slice(), cut), (&b"chunk 39\n"[..], true));
    }
}
