//! The bounded soak on the bwrap plugin: mixed create / exec / fs::write /
//! fs::read / stop at the caps (`max_concurrent_sandboxes`, exec slots) for
//! `SANDBOX_SOAK_SECS` seconds (default 60 here; `scripts/soak.sh` runs 600), with a guest
//! flooding its agent with signals and a worker VM flooding its output all along (their host
//! logs checked against the README's ceiling each round), then the adapter's fds, threads and
//! RSS, the sandboxes' cgroups, the host's mounts, the state directories and the adapter's
//! processes (of any id, reparented ones too) must come back to where they started. Prints
//! the snapshots. Only this adapter's groups and processes are counted: other adapters on
//! the host (other tests, other users' runs) come and go meanwhile.

mod sandbox_support;
mod worker_support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e_tests::{bwrap_usable, s_code, Stack};
use sandbox_support::{eventually, status_kib};
use serde_json::{json, Value};

const CAP: usize = 4;
const WORKERS: usize = 6;
/// RSS the adapter may keep above its start after the soak (allocator caches, the image
/// store's index).
const RSS_SLACK_KIB: u64 = 96 * 1024;
/// One log's ceiling on the host (README "Logs"): two files of 2 MiB.
const LOG_CEILING: u64 = 2 * (2 << 20);
/// What the log flood's worker prints a start.
const LOG_FLOOD_BYTES: u64 = 40 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    fds: usize,
    threads: u64,
    rss_kib: u64,
    cgroups: usize,
    mounts: usize,
    state_dirs: usize,
    /// The adapter's processes, whoever's child they are now (see `Own::processes`).
    processes: usize,
}

/// What belongs to this soak's adapter, so that other adapters running on the host (other
/// tests, other users' runs) are not counted: its cgroup instance directories
/// (`adapter::info`'s `isolation.cgroup_instance`: its sandboxes' groups lie beneath, and
/// only theirs) and its state directory.
struct Own {
    instance: Vec<PathBuf>,
    state_dir: String,
}

impl Own {
    async fn of(stack: &Stack) -> Own {
        let info = call(stack, "adapter::info", json!({})).await;
        let instance = info["backend"]["isolation"]["cgroup_instance"]
            .as_array()
            .map(|dirs| {
                dirs.iter()
                    .filter_map(Value::as_str)
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        Own {
            instance,
            state_dir: stack.state_dir.path().display().to_string(),
        }
    }

    /// The adapter's sandboxes' groups (one a hierarchy on cgroup v1).
    fn cgroups(&self) -> usize {
        self.instance
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flat_map(|entries| entries.flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with("launcher-"))
            .count()
    }

    /// The adapter's processes: its descendants, and, even once their parent died and they
    /// were handed to init, those in one of its groups or naming its state directory.
    fn processes(&self, adapter: u32) -> usize {
        let names: Vec<String> = self
            .instance
            .iter()
            .filter_map(|dir| Some(format!("/{}/", dir.file_name()?.to_str()?)))
            .collect();
        let mut pids: std::collections::BTreeSet<u32> = sandbox_support::descendants(adapter)
            .iter()
            .map(|p| p.pid)
            .collect();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return pids.len();
        };
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            // Gone between the listing and the reads: not counted.
            if names.iter().any(|name| cgroup.contains(name.as_str()))
                || String::from_utf8_lossy(&cmdline).contains(&self.state_dir)
            {
                pids.insert(pid);
            }
        }
        pids.len()
    }
}

fn snapshot(stack: &Stack, own: &Own) -> Snapshot {
    let pid = stack.adapter.pid();
    let count = |path: String| std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0);
    Snapshot {
        fds: count(format!("/proc/{pid}/fd")),
        threads: status_kib(pid, "Threads").unwrap_or(0),
        rss_kib: status_kib(pid, "VmRSS").unwrap_or(0),
        cgroups: own.cgroups(),
        mounts: std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .map(|m| m.lines().count())
            .unwrap_or(0),
        state_dirs: count(
            stack
                .state_dir
                .path()
                .join("sandboxes")
                .display()
                .to_string(),
        ),
        processes: own.processes(pid),
    }
}

/// Whether `now` is back at `start` (RSS within its slack; threads of the blocking pool may
/// take their keep-alive to go).
fn settled(start: &Snapshot, now: &Snapshot) -> bool {
    now.fds <= start.fds
        && now.threads <= start.threads
        && now.rss_kib <= start.rss_kib + RSS_SLACK_KIB
        && now.cgroups <= start.cgroups
        && now.mounts <= start.mounts
        && now.state_dirs <= start.state_dirs
        && now.processes <= start.processes
}

#[derive(Default)]
struct Counts {
    creates: AtomicU64,
    refused_at_cap: AtomicU64,
    execs: AtomicU64,
    writes: AtomicU64,
    reads: AtomicU64,
    stops: AtomicU64,
    signal_floods: AtomicU64,
    log_floods: AtomicU64,
}

async fn call(stack: &Stack, function: &str, payload: Value) -> Value {
    stack
        .call(function, payload)
        .await
        .unwrap_or_else(|e| panic!("{function}: {e:?}\n{}", stack.adapter.log()))
}

/// One client: create (S400 at the cap: wait and again), a few execs and a file round trip
/// at once, then stop.
async fn client(stack: Arc<Stack>, deadline: Instant, counts: Arc<Counts>, seed: usize) {
    let content = vec![b'a' + (seed % 26) as u8; 256 * 1024];
    let b64 = base64::engine::general_purpose::STANDARD.encode(&content);
    while Instant::now() < deadline {
        let created = stack.call("create", json!({"image": "python"})).await;
        let id = match created {
            Ok(answer) => answer["sandbox_id"].as_str().unwrap().to_string(),
            Err(e) if s_code(&e) == "S400" => {
                counts.refused_at_cap.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => panic!("create: {e:?}\n{}", stack.adapter.log()),
        };
        counts.creates.fetch_add(1, Ordering::Relaxed);
        let execs = (0..3).map(|i| {
            let stack = &stack;
            let id = &id;
            async move {
                let out = call(
                    stack,
                    "exec",
                    json!({"sandbox_id": id, "argv": ["sh", "-c", format!("echo {i}")]}),
                )
                .await;
                assert_eq!(out["stdout"], format!("{i}\n"), "{out}");
            }
        });
        let file = async {
            let path = format!("/tmp/soak-{seed}");
            let wrote = call(
                &stack,
                "fs::write",
                json!({"sandbox_id": id, "path": path, "content_b64": b64}),
            )
            .await;
            assert_eq!(wrote["bytes_written"], content.len(), "{wrote}");
            let read = call(&stack, "fs::read", json!({"sandbox_id": id, "path": path})).await;
            assert_eq!(read["size"], content.len(), "{read}");
        };
        futures::future::join(futures::future::join_all(execs), file).await;
        counts.execs.fetch_add(3, Ordering::Relaxed);
        counts.writes.fetch_add(1, Ordering::Relaxed);
        counts.reads.fetch_add(1, Ordering::Relaxed);
        let stopped = call(&stack, "stop", json!({"sandbox_id": id, "wait": true})).await;
        assert_eq!(stopped["stopped"], true, "{stopped}");
        counts.stops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bytes in the regular files under `dir` whose name `wanted` accepts (links not followed).
fn bytes_under(dir: &Path, wanted: &dyn Fn(&str) -> bool) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() && wanted(&entry.file_name().to_string_lossy()) {
                total += meta.len();
            }
        }
    }
    total
}

/// The signal flood: a sandbox whose program, ignoring SIGTERM and SIGINT, sends both to the
/// agent in a loop for 3 s; the sandbox's host files stay under one log's ceiling.
async fn signal_flooder(stack: Arc<Stack>, deadline: Instant, counts: Arc<Counts>) {
    let flood = "import os, signal, time\n\
                 signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                 signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
                 end = time.time() + 3\n\
                 while time.time() < end:\n\
                 \x20   os.kill(1, signal.SIGTERM); os.kill(1, signal.SIGINT)\n";
    while Instant::now() < deadline {
        let id = match stack.call("create", json!({"image": "python"})).await {
            Ok(answer) => answer["sandbox_id"].as_str().unwrap().to_string(),
            Err(e) if s_code(&e) == "S400" => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => panic!("create: {e:?}\n{}", stack.adapter.log()),
        };
        let layer = stack.state_dir.path().join("sandboxes").join(&id);
        call(
            &stack,
            "exec",
            json!({"sandbox_id": id, "argv": ["python3", "-c", flood], "timeout_ms": 30_000}),
        )
        .await;
        let bytes = bytes_under(&layer, &|_| true);
        assert!(bytes < LOG_CEILING, "a signal flood left {bytes} bytes");
        call(&stack, "stop", json!({"sandbox_id": id, "wait": true})).await;
        counts.signal_floods.fetch_add(1, Ordering::Relaxed);
    }
}

/// The log flood: a worker VM printing [`LOG_FLOOD_BYTES`] a start, started again whenever it
/// ends; its host logs (the worker's and its sandbox's) stay under two logs' ceiling while
/// it runs. Destroyed at the end, so it leaves nothing.
async fn log_flooder(stack: Arc<Stack>, compose: PathBuf, deadline: Instant, counts: Arc<Counts>) {
    let vm = json!({"vm_id": "soak-flood"});
    let prepare = json!({"vm_id": "soak-flood", "image": "python", "host_path": compose});
    worker_support::worker_ok(&stack, "prepare", prepare).await;
    let flood = format!(
        "import sys\nline = b'y' * 65535 + b'\\n'\nfor _ in range({}):\n    sys.stdout.buffer.write(line)\n",
        LOG_FLOOD_BYTES / 65536
    );
    let start = json!({"vm_id": "soak-flood", "command": ["python3", "-c", flood]});
    let dir = stack.state_dir.path().join("workers/soak-flood");
    let log_file = |name: &str| name.ends_with(".log") || name.ends_with(".log.1");
    while Instant::now() < deadline {
        worker_support::worker_ok(&stack, "start", start.clone()).await;
        let mut peak = 0;
        loop {
            let status = worker_support::worker_ok(&stack, "status", vm.clone()).await;
            peak = peak.max(bytes_under(&dir, &log_file));
            if status["state"] != "running" {
                assert_eq!(status["exit_code"], 0, "{status}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            peak <= 2 * LOG_CEILING,
            "a worker's logs reached {peak} bytes"
        );
        counts.log_floods.fetch_add(1, Ordering::Relaxed);
    }
    worker_support::worker_ok(&stack, "destroy", vm).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_soak_at_the_caps_leaves_nothing_behind() {
    let test = "a_soak_at_the_caps_leaves_nothing_behind";
    if !bwrap_usable(test) {
        return;
    }
    let secs: u64 = std::env::var("SANDBOX_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let compose = e2e_tests::host_dir();
    let stack = Arc::new(
        Stack::start(
            json!({"max_concurrent_sandboxes": CAP, "default_disk_mb": 64}),
            worker_support::compose_options(compose.path()),
        )
        .await,
    );
    // One round first, so what every create pulls in once (the image, the launcher pool,
    // the runtime's threads) is in the baseline.
    client(
        Arc::clone(&stack),
        Instant::now(),
        Arc::new(Counts::default()),
        0,
    )
    .await;
    let warm = call(&stack, "create", json!({"image": "python"})).await;
    let id = warm["sandbox_id"].as_str().unwrap();
    call(&stack, "stop", json!({"sandbox_id": id, "wait": true})).await;
    // A worker VM's first start brings up the bus guard's thread and sockets, which then
    // serve every worker VM for the adapter's life: in the baseline too.
    let vm = json!({"vm_id": "soak-warm"});
    let prepare = json!({"vm_id": "soak-warm", "image": "python", "host_path": compose.path()});
    worker_support::worker_ok(&stack, "prepare", prepare).await;
    let start = json!({"vm_id": "soak-warm", "command": ["true"]});
    worker_support::worker_ok(&stack, "start", start).await;
    worker_support::worker_ok(&stack, "destroy", vm).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let own = Own::of(&stack).await;
    let start = snapshot(&stack, &own);

    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let clients: Vec<_> = (0..WORKERS)
        .map(|seed| {
            tokio::spawn(client(
                Arc::clone(&stack),
                deadline,
                Arc::clone(&counts),
                seed,
            ))
        })
        .collect();
    let floods = [
        tokio::spawn(signal_flooder(
            Arc::clone(&stack),
            deadline,
            Arc::clone(&counts),
        )),
        tokio::spawn(log_flooder(
            Arc::clone(&stack),
            compose.path().to_path_buf(),
            deadline,
            Arc::clone(&counts),
        )),
    ];
    let mut peak = start;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = snapshot(&stack, &own);
        peak = Snapshot {
            fds: peak.fds.max(now.fds),
            threads: peak.threads.max(now.threads),
            rss_kib: peak.rss_kib.max(now.rss_kib),
            cgroups: peak.cgroups.max(now.cgroups),
            mounts: peak.mounts.max(now.mounts),
            state_dirs: peak.state_dirs.max(now.state_dirs),
            processes: peak.processes.max(now.processes),
        };
    }
    for client in clients.into_iter().chain(floods) {
        client.await.expect("a soak client panicked");
    }
    let came_back = eventually(Duration::from_secs(30), || async {
        settled(&start, &snapshot(&stack, &own))
    })
    .await;
    let end = snapshot(&stack, &own);
    let total = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "soak of {secs} s, {WORKERS} clients, cap {CAP}: {} creates ({} refused at the cap), {} execs, {} writes, {} reads, {} stops; {} signal floods, {} log floods of {} MiB",
        total(&counts.creates),
        total(&counts.refused_at_cap),
        total(&counts.execs),
        total(&counts.writes),
        total(&counts.reads),
        total(&counts.stops),
        total(&counts.signal_floods),
        total(&counts.log_floods),
        LOG_FLOOD_BYTES >> 20
    );
    println!("| | fds | threads | RSS KiB | cgroups | mounts | state dirs | processes |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, s) in [("start", start), ("peak", peak), ("end", end)] {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            s.fds, s.threads, s.rss_kib, s.cgroups, s.mounts, s.state_dirs, s.processes
        );
    }
    assert!(total(&counts.stops) > 0, "the soak ran no sandbox");
    assert!(
        total(&counts.signal_floods) > 0 && total(&counts.log_floods) > 0,
        "the floods ran"
    );
    assert!(
        came_back,
        "the adapter did not come back to where it started: start {start:?}, end {end:?}\n{}",
        stack.adapter.log()
    );
}
