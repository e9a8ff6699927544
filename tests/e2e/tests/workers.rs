//! Worker VMs (`worker::*`, SPEC.md section 6) end to end on the bwrap plugin: the lifecycle
//! with state that survives restarts, the host roots (S501), the Compose file that no guest
//! may see, the token that never enters a guest, the restart of running workers after the
//! adapter dies, destroy, and malformed payloads.

mod sandbox_support;
mod worker_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e_tests::{bwrap_usable, s_code, AdapterOptions, Stack};
use sandbox_support::{eventually, Canary};
use serde_json::{json, Value};
use worker_support::{log_of, wait_log, worker_err, worker_ok, TOKEN};

/// How long a worker's log may take to show what the tests wait for.
const LOG_WAIT: Duration = Duration::from_secs(60);

/// A Compose project on the host: `project/` (the Compose dir, with `iii.yaml` holding a
/// secret), `packages/` under a Compose state dir, and `outside/`, under no root.
struct Project {
    base: tempfile::TempDir,
}

impl Project {
    fn new() -> Project {
        let base = e2e_tests::host_dir();
        let project = base.path().join("project");
        std::fs::create_dir_all(project.join("svc/lib")).unwrap();
        std::fs::create_dir_all(base.path().join("state/packages")).unwrap();
        std::fs::create_dir_all(base.path().join("outside")).unwrap();
        std::fs::write(
            project.join("iii.yaml"),
            "workers: {secret: compose-secret}\n",
        )
        .unwrap();
        std::fs::write(project.join("main.txt"), "hello from the host\n").unwrap();
        std::fs::write(project.join("svc/lib/mod.txt"), "deep file\n").unwrap();
        std::fs::write(base.path().join("outside/x.txt"), "outside\n").unwrap();
        Project { base }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.base.path().join(rel)
    }

    fn dir(&self) -> PathBuf {
        self.path("project")
    }

    /// Adapter options: the worker token and the roots (the Compose dir, the Compose state
    /// dir, and the base itself as a declared `path://` worker dir when `base_is_worker_dir`).
    fn options(&self, base_is_worker_dir: bool) -> AdapterOptions {
        let mut env = vec![
            ("III_SANDBOX_WORKER_TOKEN".to_string(), TOKEN.to_string()),
            ("III_COMPOSE_DIR".into(), self.dir().display().to_string()),
            (
                "III_COMPOSE_STATE_DIR".into(),
                self.path("state").display().to_string(),
            ),
        ];
        if base_is_worker_dir {
            env.push((
                "III_COMPOSE_WORKER_DIRS".into(),
                format!("/nonexistent-worker-dir:{}", self.base.path().display()),
            ));
        }
        AdapterOptions {
            env,
            ..AdapterOptions::default()
        }
    }
}

async fn start_stack(project: &Project, base_is_worker_dir: bool) -> Stack {
    Stack::start(json!({}), project.options(base_is_worker_dir)).await
}

async fn prepare(stack: &Stack, vm_id: &str, host_path: &Path) -> Value {
    worker_ok(
        stack,
        "prepare",
        json!({"vm_id": vm_id, "image": "python", "host_path": host_path}),
    )
    .await
}

async fn start_sh(stack: &Stack, vm_id: &str, script: &str, env: Value) -> Value {
    worker_ok(
        stack,
        "start",
        json!({"vm_id": vm_id, "command": ["/bin/sh", "-c", script], "env": env}),
    )
    .await
}

async fn status(stack: &Stack, vm_id: &str) -> Value {
    worker_ok(stack, "status", json!({ "vm_id": vm_id })).await
}

/// Waits until the worker's state is `state`; the status as it then was.
async fn wait_state(stack: &Stack, vm_id: &str, state: &str) -> Value {
    let reached = eventually(Duration::from_secs(60), || async {
        status(stack, vm_id).await["state"] == state
    })
    .await;
    let now = status(stack, vm_id).await;
    assert!(
        reached,
        "{vm_id} never became {state}: {now}\n{}",
        stack.adapter.log()
    );
    now
}

fn worker_dir(stack: &Stack, vm_id: &str) -> PathBuf {
    stack.state_dir.path().join("workers").join(vm_id)
}

/// Every regular file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if kind.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_runs_stops_and_keeps_its_state_and_root_across_starts() {
    if !bwrap_usable("a_worker_runs_stops_and_keeps_its_state_and_root_across_starts") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    let prepared = prepare(&stack, "api", &project.path("project/svc")).await;
    assert_eq!(prepared["state"], "prepared", "{prepared}");
    assert_eq!(
        PathBuf::from(prepared["state_dir"].as_str().unwrap()),
        worker_dir(&stack, "api")
    );
    assert_eq!(status(&stack, "api").await["state"], "prepared");
    assert_eq!(
        prepare(&stack, "api", &project.path("project/svc")).await,
        prepared,
        "prepare is idempotent"
    );
    // A prepared (not running) VM takes a new host_path, and the old one back.
    prepare(&stack, "api", &project.path("project/svc/lib")).await;
    assert_eq!(
        PathBuf::from(status(&stack, "api").await["host_path"].as_str().unwrap()),
        project.path("project/svc/lib")
    );
    prepare(&stack, "api", &project.path("project/svc")).await;

    let script = "trap 'echo got-term; exit 0' TERM; echo started; \
        [ -f /opt/x ] && echo root-kept; mkdir -p /opt && echo x > /opt/x; \
        [ -f /state/f ] && echo state-kept; echo data > /state/f; \
        while true; do echo tick; sleep 0.2; done";
    let started = start_sh(&stack, "api", script, json!({})).await;
    assert_eq!(started["state"], "running", "{started}");
    assert!(started["pid"].as_u64().is_some(), "{started}");
    assert!(
        started["started_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{started}"
    );
    let (code, message) = worker_err(
        &stack,
        "prepare",
        json!({"vm_id": "api", "image": "node", "host_path": project.path("project/svc")}),
    )
    .await;
    assert_eq!(code, "S001", "a running VM keeps its image: {message}");
    assert!(message.contains("stop it first"), "{message}");
    let again = start_sh(&stack, "api", "exit 3", json!({})).await;
    assert_eq!(
        again["pid"], started["pid"],
        "start on a running VM answers its status"
    );
    let now = status(&stack, "api").await;
    assert_eq!(now["state"], "running");
    assert_eq!(now["pid"], started["pid"]);
    assert_eq!(now["image"], "python");
    wait_log(&stack, "api", "tick", 3, LOG_WAIT).await;
    let first = log_of(&stack, "api").await;
    assert!(
        !first.contains("state-kept") && !first.contains("root-kept"),
        "{first}"
    );
    let limited = worker_ok(&stack, "logs", json!({"vm_id": "api", "max_bytes": 5})).await;
    assert_eq!(limited["content"].as_str().unwrap().len(), 5, "{limited}");
    assert_eq!(limited["truncated"], true);

    let stopped = worker_ok(&stack, "stop", json!({"vm_id": "api", "timeout_ms": 5000})).await;
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    let now = status(&stack, "api").await;
    assert_eq!(now["state"], "stopped", "{now}");
    let log = log_of(&stack, "api").await;
    assert!(log.contains("got-term"), "stop sends SIGTERM first: {log}");
    assert!(now.get("pid").is_none(), "no pid once stopped: {now}");
    let pid = started["pid"].as_u64().unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the VM process outlived stop"
    );
    assert_eq!(
        worker_ok(&stack, "stop", json!({"vm_id": "api"})).await["state"],
        "stopped",
        "stop is idempotent"
    );
    // A root adapter keeps it in the worker's layer image (bounded; see disk.rs' tests).
    let on_host = worker_dir(&stack, "api").join("data/f").is_file();
    if stack.worker_state_in_image().await {
        assert!(
            !on_host,
            "/state is in the layer image, not the host's data/"
        );
    } else {
        assert!(on_host, "/state is the host's data/");
    }

    start_sh(&stack, "api", script, json!({})).await;
    let log = wait_log(&stack, "api", "started", 2, LOG_WAIT).await;
    wait_log(&stack, "api", "state-kept", 1, LOG_WAIT).await;
    let log = if log.contains("root-kept") {
        log
    } else {
        wait_log(&stack, "api", "root-kept", 1, LOG_WAIT).await
    };
    assert!(log.contains("root-kept"), "{log}");
    worker_ok(&stack, "stop", json!({"vm_id": "api", "timeout_ms": 5000})).await;
}

/// A root adapter's worker writes `/state` as its subordinate ids on the host, never as host
/// root: the setuid copy of a shell that the guest's root leaves there belongs to an id no
/// host user holds. A `/state` written by an earlier version (owned on disk by the ids seen
/// inside) is moved into the range at the next start and looks the same inside.
#[tokio::test(flavor = "multi_thread")]
async fn a_root_adapters_worker_state_belongs_to_subordinate_ids_on_the_host() {
    use std::os::unix::fs::MetadataExt;
    let test = "a_root_adapters_worker_state_belongs_to_subordinate_ids_on_the_host";
    if !bwrap_usable(test) {
        return;
    }
    if e2e_tests::adapter_user().is_some() || !nix::unistd::geteuid().is_root() {
        println!(
            "{test}: DID NOT RUN: only a root adapter has subordinate ids (an ordinary user's \
             guest root is that user)"
        );
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    prepare(&stack, "owned", &project.dir()).await;
    let data = worker_dir(&stack, "owned").join("data");
    std::fs::create_dir_all(data.join("old")).unwrap();
    std::fs::write(data.join("old/kept"), "from an earlier version\n").unwrap();
    std::os::unix::fs::chown(data.join("old/kept"), Some(1000), Some(1000)).unwrap();
    let script = "stat -c 'old %u:%g' /state/old/kept; cat /state/old/kept; \
                  cp /bin/sh /state/plant && chmod 4755 /state/plant; \
                  stat -c 'plant %u:%g %a' /state/plant; echo done";
    start_sh(&stack, "owned", script, json!({})).await;
    let log = wait_log(&stack, "owned", "done", 1, LOG_WAIT).await;
    assert!(
        log.contains("old 1000:1000"),
        "the moved file inside: {log}"
    );
    assert!(log.contains("from an earlier version"), "{log}");
    assert!(
        log.contains("plant 0:0 4755"),
        "the guest's root made it: {log}"
    );

    let plant = std::fs::metadata(data.join("plant")).unwrap();
    let top = std::fs::metadata(&data).unwrap();
    let kept = std::fs::metadata(data.join("old/kept")).unwrap();
    assert!(
        plant.uid() >= 65536 && plant.gid() >= 65536,
        "the guest root's setuid file is host {}:{}",
        plant.uid(),
        plant.gid()
    );
    assert_eq!((top.uid(), top.gid()), (plant.uid(), plant.gid()));
    assert_eq!(
        (kept.uid(), kept.gid()),
        (plant.uid() + 1000, plant.gid() + 1000),
        "the earlier file moved by the same offset"
    );

    // Moved once: a second start finds it as the guest left it.
    worker_ok(
        &stack,
        "stop",
        json!({"vm_id": "owned", "timeout_ms": 3000}),
    )
    .await;
    start_sh(
        &stack,
        "owned",
        "stat -c 'again %u:%g %a' /state/plant",
        json!({}),
    )
    .await;
    let log = wait_log(&stack, "owned", "again ", 1, LOG_WAIT).await;
    assert!(log.contains("again 0:0 4755"), "{log}");
    worker_ok(&stack, "destroy", json!({"vm_id": "owned"})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn host_paths_outside_the_roots_are_s501_naming_the_roots() {
    if !bwrap_usable("host_paths_outside_the_roots_are_s501_naming_the_roots") {
        return;
    }
    let project = Project::new();
    std::os::unix::fs::symlink(project.path("outside"), project.path("project/escape")).unwrap();
    let stack = start_stack(&project, false).await;
    let root = project.dir().canonicalize().unwrap().display().to_string();
    let outside = [
        project.path("outside"),
        project.path("project/svc/../../outside"),
        project.path("project/escape"),
        project.path("project/missing"),
        PathBuf::from("/"),
        PathBuf::from("relative"),
    ];
    for host_path in outside {
        let (code, message) = worker_err(
            &stack,
            "prepare",
            json!({"vm_id": "w", "image": "python", "host_path": host_path}),
        )
        .await;
        assert_eq!(code, "S501", "{}: {message}", host_path.display());
        assert!(
            message.contains(&root),
            "the message names the roots: {message}"
        );
    }
    assert!(!worker_dir(&stack, "w").exists(), "nothing prepared");
    // The package cache is a root too.
    prepare(&stack, "pkg", &project.path("state/packages")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_roots_configured_refuses_every_host_path() {
    if !bwrap_usable("no_roots_configured_refuses_every_host_path") {
        return;
    }
    let project = Project::new();
    let options = AdapterOptions {
        env: vec![
            ("III_SANDBOX_WORKER_TOKEN".into(), TOKEN.into()),
            // No Compose dir, and a HOME without ~/.iii/compose/packages.
            ("HOME".into(), project.path("outside").display().to_string()),
        ],
        ..AdapterOptions::default()
    };
    let stack = Stack::start(json!({}), options).await;
    let (code, message) = worker_err(
        &stack,
        "prepare",
        json!({"vm_id": "w", "image": "python", "host_path": project.dir()}),
    )
    .await;
    assert_eq!(code, "S501", "{message}");
    assert!(message.contains("III_COMPOSE_DIR"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compose_file_is_invisible_and_worker_is_read_only() {
    if !bwrap_usable("the_compose_file_is_invisible_and_worker_is_read_only") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, true).await;
    let script = "echo \"ls: $(ls -a . | tr '\\n' ' ')\"; \
        cat iii.yaml && echo CAT-OK || echo CAT-FAILED; \
        cat main.txt; \
        touch /worker/new 2>/dev/null && echo WRITE-OK || echo WRITE-FAILED; \
        echo x >> main.txt 2>/dev/null && echo APPEND-OK || echo APPEND-FAILED; \
        echo DONE; exit 7";
    // host_path = the Compose dir itself.
    prepare(&stack, "direct", &project.dir()).await;
    start_sh(&stack, "direct", script, json!({})).await;
    let done = wait_state(&stack, "direct", "exited").await;
    assert_eq!(done["exit_code"], 7, "{done}");
    assert!(done.get("pid").is_none(), "{done}");
    let log = log_of(&stack, "direct").await;
    assert!(log.contains("DONE"), "{log}");
    let listing = log
        .lines()
        .find(|l| l.starts_with("ls:"))
        .unwrap_or_default();
    assert!(!listing.contains("iii.yaml"), "{log}");
    assert!(
        listing.contains("main.txt") && listing.contains("svc"),
        "{log}"
    );
    assert!(
        log.contains("CAT-FAILED") && !log.contains("compose-secret"),
        "{log}"
    );
    assert!(log.contains("hello from the host"), "{log}");
    assert!(
        log.contains("WRITE-FAILED") && log.contains("APPEND-FAILED"),
        "{log}"
    );
    assert!(!project.dir().join("new").exists());
    assert_eq!(
        std::fs::read_to_string(project.dir().join("main.txt")).unwrap(),
        "hello from the host\n"
    );

    // host_path = a declared worker dir that holds the Compose dir deeper down.
    prepare(&stack, "parent", project.base.path()).await;
    let script = "cd project; \
        echo \"ls: $(ls -a . | tr '\\n' ' ')\"; \
        cat iii.yaml && echo CAT-OK || echo CAT-FAILED; \
        cat main.txt svc/lib/mod.txt ../outside/x.txt; \
        touch /worker/project/new 2>/dev/null && echo WRITE-OK || echo WRITE-FAILED; \
        exit 0";
    start_sh(&stack, "parent", script, json!({})).await;
    let done = wait_state(&stack, "parent", "exited").await;
    assert_eq!(done["exit_code"], 0, "{done}");
    let log = log_of(&stack, "parent").await;
    let listing = log
        .lines()
        .find(|l| l.starts_with("ls:"))
        .unwrap_or_default();
    assert!(
        !listing.contains("iii.yaml") && listing.contains("main.txt"),
        "{log}"
    );
    assert!(
        log.contains("CAT-FAILED") && !log.contains("compose-secret"),
        "{log}"
    );
    for text in ["hello from the host", "deep file", "outside"] {
        assert!(log.contains(text), "{text}: {log}");
    }
    assert!(log.contains("WRITE-FAILED"), "{log}");

    // An exited VM starts again; the exit code is the new run's.
    start_sh(&stack, "parent", "echo second-run; exit 4", json!({})).await;
    wait_log(&stack, "parent", "second-run", 1, LOG_WAIT).await;
    let done = wait_state(&stack, "parent", "exited").await;
    assert_eq!(done["exit_code"], 4, "{done}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_never_reaches_a_guest_or_the_disk() {
    if !bwrap_usable("the_token_never_reaches_a_guest_or_the_disk") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    prepare(&stack, "env", &project.dir()).await;
    let env = json!({
        "III_SANDBOX_WORKER_TOKEN": TOKEN,
        "SNEAKY": TOKEN,
        "WRAPPED": format!("Bearer {TOKEN}"),
        "KEPT": "visible",
    });
    start_sh(
        &stack,
        "env",
        "env; echo ENV-DONE; cat /proc/1/environ >/dev/null 2>&1; exit 0",
        env,
    )
    .await;
    wait_state(&stack, "env", "exited").await;
    let log = log_of(&stack, "env").await;
    assert!(log.contains("ENV-DONE"), "{log}");
    assert!(!log.contains(TOKEN), "the token reached the guest: {log}");
    assert!(
        !log.contains("SNEAKY=") && !log.contains("WRAPPED="),
        "{log}"
    );
    assert!(log.contains("KEPT=visible"), "{log}");
    assert!(log.contains("III_WORKER_VM_ID=env"), "{log}");
    let url = stack.engine.url();
    assert!(
        log.contains(&format!("III_URL={url}")),
        "the engine's address {url}: {log}"
    );

    // The token in the command itself is refused, without echoing it.
    let (code, message) = worker_err(
        &stack,
        "start",
        json!({"vm_id": "env", "command": ["/bin/echo", TOKEN]}),
    )
    .await;
    assert_eq!(code, "S001");
    assert!(!message.contains(TOKEN), "{message}");

    let leaks = files_containing(stack.state_dir.path(), TOKEN.as_bytes());
    assert!(leaks.is_empty(), "files holding the token: {leaks:?}");
    assert!(
        !stack.adapter.log().contains(TOKEN),
        "the adapter logged the token"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn running_workers_start_again_after_the_adapter_is_killed() {
    if !bwrap_usable("running_workers_start_again_after_the_adapter_is_killed") {
        return;
    }
    let project = Project::new();
    let mut stack = start_stack(&project, false).await;
    prepare(&stack, "svc", &project.path("project/svc")).await;
    prepare(&stack, "idle", &project.path("project/svc")).await;
    let script = "echo run >> /state/runs; echo started $(wc -l < /state/runs) runs; \
        while true; do sleep 0.2; done";
    let first = start_sh(&stack, "svc", script, json!({})).await;
    wait_log(&stack, "svc", "started", 1, LOG_WAIT).await;
    let old_pid = first["pid"].as_u64().unwrap();

    stack.adapter.kill9();
    let gone = eventually(Duration::from_secs(10), || async {
        !Path::new(&format!("/proc/{old_pid}")).exists()
    })
    .await;
    assert!(gone, "the worker VM outlived its adapter");
    stack.restart_adapter(&project.options(false)).await;

    wait_log(&stack, "svc", "started", 2, LOG_WAIT).await;
    let now = wait_state(&stack, "svc", "running").await;
    let new_pid = now["pid"].as_u64().expect("a pid once restarted");
    assert_ne!(new_pid, old_pid, "{now}");
    // /state kept the first run's line (wherever it lives: host directory or layer image).
    let log = wait_log(&stack, "svc", "started 2 runs", 1, LOG_WAIT).await;
    assert!(log.contains("started 1 runs"), "{log}");
    assert_eq!(
        status(&stack, "idle").await["state"],
        "prepared",
        "only running workers restart"
    );

    // An orderly shutdown (SIGTERM) ends the VM too, and leaves it to be started again.
    let status_code = stack
        .adapter
        .terminate()
        .expect("the adapter exits on SIGTERM");
    assert!(
        status_code.success(),
        "{status_code:?}\n{}",
        stack.adapter.log()
    );
    assert!(
        !Path::new(&format!("/proc/{new_pid}")).exists(),
        "the worker VM outlived an orderly shutdown"
    );
    stack.restart_adapter(&project.options(false)).await;
    wait_log(&stack, "svc", "started", 3, LOG_WAIT).await;
    wait_state(&stack, "svc", "running").await;
    worker_ok(&stack, "stop", json!({"vm_id": "svc", "timeout_ms": 2000})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn destroy_deletes_the_state_and_unknown_ids_are_handled() {
    if !bwrap_usable("destroy_deletes_the_state_and_unknown_ids_are_handled") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    let (code, _) = worker_err(
        &stack,
        "start",
        json!({"vm_id": "never", "command": ["true"]}),
    )
    .await;
    assert_eq!(code, "S002", "start of a never-prepared VM");
    for op in ["status", "logs", "stop"] {
        let (code, _) = worker_err(&stack, op, json!({"vm_id": "never"})).await;
        assert_eq!(code, "S002", "{op} of a never-prepared VM");
    }
    prepare(&stack, "gone", &project.dir()).await;
    start_sh(&stack, "gone", "while true; do sleep 0.2; done", json!({})).await;
    let pid = status(&stack, "gone").await["pid"].as_u64().unwrap();
    assert!(worker_dir(&stack, "gone").is_dir());
    let destroyed = worker_ok(&stack, "destroy", json!({"vm_id": "gone"})).await;
    assert_eq!(destroyed, json!({"vm_id": "gone", "destroyed": true}));
    assert!(!worker_dir(&stack, "gone").exists(), "state dir deleted");
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "VM stopped");
    let again = worker_ok(&stack, "destroy", json!({"vm_id": "gone"})).await;
    assert_eq!(again["destroyed"], false, "destroy is idempotent");
    let (code, _) = worker_err(&stack, "status", json!({"vm_id": "gone"})).await;
    assert_eq!(code, "S002");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_worker_payloads_are_s001_and_the_adapter_keeps_serving() {
    if !bwrap_usable("malformed_worker_payloads_are_s001_and_the_adapter_keeps_serving") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    prepare(&stack, "ok", &project.dir()).await;
    let dir = project.dir();
    let cases = [
        (
            "prepare",
            json!({"vm_id": "Bad", "image": "python", "host_path": dir}),
        ),
        (
            "prepare",
            json!({"vm_id": "-a", "image": "python", "host_path": dir}),
        ),
        (
            "prepare",
            json!({"vm_id": "a".repeat(64), "image": "python", "host_path": dir}),
        ),
        (
            "prepare",
            json!({"vm_id": "a/b", "image": "python", "host_path": dir}),
        ),
        ("prepare", json!({"vm_id": "w", "host_path": dir})),
        (
            "prepare",
            json!({"vm_id": "w", "image": 5, "host_path": dir}),
        ),
        (
            "prepare",
            json!({"vm_id": "w", "image": "python", "host_path": dir, "cpus": "two"}),
        ),
        (
            "prepare",
            json!({"vm_id": "w", "image": "python", "host_path": dir, "cpus": 0}),
        ),
        ("start", json!({"vm_id": "ok"})),
        ("start", json!({"vm_id": "ok", "command": []})),
        ("start", json!({"vm_id": "ok", "command": "echo hi"})),
        ("start", json!({"vm_id": "ok", "command": [1, 2]})),
        (
            "start",
            json!({"vm_id": "ok", "command": ["true"], "env": 3}),
        ),
        (
            "start",
            json!({"vm_id": "ok", "command": ["true"], "workdir": "relative"}),
        ),
        ("status", json!({"vm_id": 7})),
        ("status", json!({})),
        ("logs", json!({"vm_id": "ok", "max_bytes": -1})),
        ("logs", json!({"vm_id": "ok", "max_bytes": 0})),
        ("stop", json!({"vm_id": "ok", "timeout_ms": "soon"})),
        ("destroy", json!({"vm_id": null})),
        ("destroy", json!({"vm_id": ".."})),
    ];
    for (op, payload) in cases {
        let shown = payload.to_string();
        let (code, message) = worker_err(&stack, op, payload).await;
        assert_eq!(code, "S001", "worker::{op} {shown}: {message}");
    }
    // Not even an object.
    let error = stack
        .call("worker::status", json!(["auth", TOKEN]))
        .await
        .expect_err("an array payload");
    assert!(
        ["S001", "S505"].contains(&s_code(&error).as_str()),
        "{error:?}"
    );
    assert_eq!(status(&stack, "ok").await["state"], "prepared");
    let info = stack
        .call("adapter::info", json!({}))
        .await
        .expect("adapter::info");
    assert!(
        info["features"]
            .as_array()
            .unwrap()
            .contains(&json!("worker_vms")),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_program_that_ignores_sigterm_is_killed_after_the_timeout() {
    if !bwrap_usable("a_program_that_ignores_sigterm_is_killed_after_the_timeout") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    prepare(&stack, "stubborn", &project.dir()).await;
    // Ignored signals stay ignored in children: `sleep` ignores SIGTERM too.
    let script = "trap '' TERM; echo up; while true; do sleep 0.2; done; echo never";
    let started = start_sh(&stack, "stubborn", script, json!({})).await;
    wait_log(&stack, "stubborn", "up", 1, LOG_WAIT).await;
    let pid = started["pid"].as_u64().unwrap();
    let stopped = worker_ok(
        &stack,
        "stop",
        json!({"vm_id": "stubborn", "timeout_ms": 300}),
    )
    .await;
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the VM survived the forced stop"
    );
    assert_eq!(status(&stack, "stubborn").await["state"], "stopped");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_command_runs_without_a_shell_and_both_streams_reach_the_log() {
    if !bwrap_usable("the_command_runs_without_a_shell_and_both_streams_reach_the_log") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    prepare(&stack, "streams", &project.dir()).await;
    // Spaces and `$` reach the program as they are: no shell between.
    let command = json!(["/bin/echo", "two  spaces", "$HOME", "'quoted'"]);
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": "streams", "command": command}),
    )
    .await;
    let done = wait_state(&stack, "streams", "exited").await;
    assert_eq!(done["exit_code"], 0, "{done}");
    let log = log_of(&stack, "streams").await;
    assert_eq!(log, "two  spaces $HOME 'quoted'\n");

    let script = "echo out-1; sleep 0.3; echo err-1 >&2; sleep 0.3; echo out-2; \
        sleep 0.3; echo err-2 >&2; exit 5";
    start_sh(&stack, "streams", script, json!({})).await;
    let done = wait_state(&stack, "streams", "exited").await;
    assert_eq!(done["exit_code"], 5, "{done}");
    let log = log_of(&stack, "streams").await;
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle} is not in the log: {log}"))
    };
    assert!(
        at("two  spaces") < at("out-1")
            && at("out-1") < at("err-1")
            && at("err-1") < at("out-2")
            && at("out-2") < at("err-2"),
        "stdout and stderr in the order they were written, after the first run's: {log}"
    );

    // A program the image lacks: the agent's message is in the log, and exit code 127.
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": "streams", "command": ["no-such-program-here"]}),
    )
    .await;
    let done = wait_state(&stack, "streams", "exited").await;
    assert_eq!(done["exit_code"], 127, "{done}");
    let log = log_of(&stack, "streams").await;
    assert!(log.contains("no-such-program-here"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_adapter_never_follows_links_planted_for_the_log() {
    if !bwrap_usable("the_adapter_never_follows_links_planted_for_the_log") {
        return;
    }
    let project = Project::new();
    let canaries = e2e_tests::host_dir();
    let shadow = Canary::plant(canaries.path(), "shadow");
    let overwritten = Canary::plant(canaries.path(), "overwritten");
    let check = |when: &str, text: &str| {
        for canary in [&shadow, &overwritten] {
            canary.assert_untouched_when(when);
            canary.assert_not_in(text, when);
        }
    };
    let stack = start_stack(&project, false).await;
    prepare(&stack, "hostile", &project.dir()).await;
    let logs_dir = worker_dir(&stack, "hostile").join("logs");
    let host_log = logs_dir.join("worker.log");

    // The log-link attack, from inside: the guest sets up links where the log used to be
    // mounted (/iii-logs) and writes 17 MiB, past the old trim limit (16 MiB).
    let script = format!(
        "mkdir -p /iii-logs && ln -sf {shadow} /iii-logs/worker.log && \
         ln -sf {overwritten} /iii-logs/worker.log.tmp && echo LINKS-PLANTED; \
         head -c 17825792 /dev/zero | tr '\\0' x; echo; \
         head -c 1048576 /dev/zero > /iii-logs/worker.log 2>/dev/null; echo ATTACK-DONE",
        shadow = shadow.path.display(),
        overwritten = overwritten.path.display(),
    );
    start_sh(&stack, "hostile", &script, json!({})).await;
    let done = wait_state(&stack, "hostile", "exited").await;
    assert_eq!(done["exit_code"], 0, "{done}");
    let log = log_of(&stack, "hostile").await;
    check("after the hostile run", &log);
    // (Its stderr may come before or after: two pipes, read as they are ready.)
    assert!(
        log.contains("ATTACK-DONE\n"),
        "{}",
        &log[log.len().saturating_sub(200)..]
    );
    // Rotated while written (README "Logs"): the log and its older half, 2 MiB each at most.
    let older = logs_dir.join("worker.log.1");
    for file in [&host_log, &older] {
        let meta = std::fs::symlink_metadata(file).unwrap();
        assert!(meta.is_file() && meta.len() <= 2 * 1024 * 1024, "{meta:?}");
    }

    // What an older adapter (which mounted logs/ in the guest) may have left: links where
    // its trim's temporary and the older half go. The next start removes them, never writing
    // through them.
    std::os::unix::fs::symlink(&overwritten.path, logs_dir.join("worker.log.tmp")).unwrap();
    std::fs::remove_file(&older).unwrap();
    std::os::unix::fs::symlink(&overwritten.path, &older).unwrap();
    start_sh(
        &stack,
        "hostile",
        "ls -la /iii-logs; echo SECOND-RUN",
        json!({}),
    )
    .await;
    wait_state(&stack, "hostile", "exited").await;
    let log = log_of(&stack, "hostile").await;
    assert!(log.contains("SECOND-RUN"), "{log}");
    let trimmed = std::fs::symlink_metadata(&host_log).unwrap();
    assert!(
        trimmed.is_file() && trimmed.len() <= 2 * 1024 * 1024,
        "the log stays within its bound: {trimmed:?}"
    );
    let older_now = std::fs::symlink_metadata(&older);
    assert!(
        older_now.as_ref().map_or(true, |m| m.is_file()),
        "the link at the older half is removed: {older_now:?}"
    );
    check("after the second start", &log);

    // A link where the log itself is: `logs` refuses it rather than answer the target...
    std::fs::remove_file(&host_log).unwrap();
    std::os::unix::fs::symlink(&shadow.path, &host_log).unwrap();
    match worker_support::worker(&stack, "logs", json!({"vm_id": "hostile"})).await {
        Ok(answer) => check("logs of a linked log", &answer.to_string()),
        Err(e) => {
            assert_eq!(s_code(&e), "S500", "{e:?}");
            check("logs of a linked log", &format!("{e:?}"));
        }
    }
    // ... and the next start replaces the link with a fresh log.
    start_sh(&stack, "hostile", "echo THIRD-RUN", json!({})).await;
    wait_state(&stack, "hostile", "exited").await;
    let log = log_of(&stack, "hostile").await;
    // (After the older half, which holds the earlier runs' newest output.)
    assert!(
        log.ends_with("\nTHIRD-RUN\n") || log == "THIRD-RUN\n",
        "{log}"
    );
    assert!(std::fs::symlink_metadata(&host_log).unwrap().is_file());
    check("after the start that replaced the link", &log);
    assert!(
        stack.adapter.log().contains("not a regular file"),
        "the replacement is logged"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_path_dot_worker_sees_no_compose_file_nor_composes_state_even_written_after_start() {
    if !bwrap_usable(
        "a_path_dot_worker_sees_no_compose_file_nor_composes_state_even_written_after_start",
    ) {
        return;
    }
    let project = Project::new();
    let mut options = project.options(false);
    options.env.push((
        "III_COMPOSE_FILE".into(),
        project
            .path("project/custom-compose.yml")
            .display()
            .to_string(),
    ));
    let stack = Stack::start(json!({}), options).await;
    // Written once the adapter serves: Compose's file under its real name, the one
    // III_COMPOSE_FILE names, and Compose's state directory with the project's token.
    std::fs::write(
        project.path("project/worker-compose.yaml"),
        "containers: {app: {worker: 'path://.'}}\n# late-compose-secret\n",
    )
    .unwrap();
    std::fs::write(
        project.path("project/custom-compose.yml"),
        "late-custom-secret\n",
    )
    .unwrap();
    std::fs::create_dir_all(project.path("project/.iii/run")).unwrap();
    std::fs::write(project.path("project/.iii/token"), "late-state-secret\n").unwrap();

    // host_path = the Compose dir (path://.).
    prepare(&stack, "dot", &project.dir()).await;
    let script = "echo \"ls: $(ls -a . | tr '\\n' ' ')\"; \
        for f in worker-compose.yaml custom-compose.yml iii.yaml .iii/token; do \
          cat \"$f\" 2>/dev/null && echo \"READ $f\" || echo \"NO $f\"; done; \
        ls .iii 2>/dev/null && echo LS-STATE || echo NO-STATE; \
        cat main.txt; echo DONE";
    start_sh(&stack, "dot", script, json!({})).await;
    let done = wait_state(&stack, "dot", "exited").await;
    assert_eq!(done["exit_code"], 0, "{done}");
    let log = log_of(&stack, "dot").await;
    assert!(
        log.contains("DONE") && log.contains("hello from the host"),
        "{log}"
    );
    let listing = log
        .lines()
        .find(|l| l.starts_with("ls:"))
        .unwrap_or_default();
    for hidden in [
        "worker-compose.yaml",
        "custom-compose.yml",
        "iii.yaml",
        ".iii",
    ] {
        assert!(!listing.contains(hidden), "{hidden} listed: {log}");
    }
    assert!(
        listing.contains("main.txt") && listing.contains("svc"),
        "{log}"
    );
    for file in [
        "worker-compose.yaml",
        "custom-compose.yml",
        "iii.yaml",
        ".iii/token",
    ] {
        assert!(log.contains(&format!("NO {file}")), "{file}: {log}");
    }
    assert!(log.contains("NO-STATE"), "{log}");
    for secret in [
        "late-compose-secret",
        "late-custom-secret",
        "late-state-secret",
        "compose-secret",
    ] {
        assert!(!log.contains(secret), "{secret} leaked: {log}");
    }

    // Compose's state directory is no host_path of its own.
    let (code, message) = worker_err(
        &stack,
        "prepare",
        json!({"vm_id": "state", "image": "python", "host_path": project.path("project/.iii/run")}),
    )
    .await;
    assert_eq!(code, "S501", "{message}");
    assert!(message.contains("no guest may see"), "{message}");

    // bwrap runs no VM: the tuning is reported, and why none of it applies.
    let tuning = &done["vm_tuning"];
    assert_eq!(tuning["backend"], "bwrap", "{done}");
    assert_eq!(tuning["requested"]["nofile_limit"], 65536, "{done}");
    assert_eq!(tuning["applied"], json!({}), "{done}");
    assert!(tuning["not_applied"]["nofile_limit"].is_string(), "{done}");
}

/// Copies the directory tree `from` into `to` (regular files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compose_file_declares_the_worker_vm_roots_and_the_tuning_is_read() {
    if !bwrap_usable("the_compose_file_declares_the_worker_vm_roots_and_the_tuning_is_read") {
        return;
    }
    // tests/fixtures/compose-project: project/worker-compose.yaml declares path://./app and
    // path://../shared (manifests with runtime.base_image), path://./plain (none) and
    // path://../bare (no manifest).
    let base = e2e_tests::host_dir();
    copy_tree(
        &e2e_tests::repo_root().join("tests/fixtures/compose-project"),
        base.path(),
    );
    let project = base.path().join("project");
    let options = AdapterOptions {
        env: vec![
            ("III_SANDBOX_WORKER_TOKEN".into(), TOKEN.into()),
            ("III_COMPOSE_DIR".into(), project.display().to_string()),
            ("III_VM_NESTED_VIRT".into(), "Yes".into()),
            ("III_VM_VIRTIOFS_SHM_SIZE_MIB".into(), "128".into()),
            ("III_VM_NOFILE_LIMIT".into(), "lots".into()),
        ],
        ..AdapterOptions::default()
    };
    let mut stack = Stack::start(json!({}), options.clone()).await;
    // No III_COMPOSE_WORKER_DIRS: ../shared is admitted by the file alone.
    prepare(&stack, "shared", &base.path().join("shared")).await;
    prepare(&stack, "app", &project.join("app")).await;
    prepare(&stack, "plain", &project.join("plain")).await;
    let (code, message) = worker_err(
        &stack,
        "prepare",
        json!({"vm_id": "bare", "image": "python", "host_path": base.path().join("bare")}),
    )
    .await;
    assert_eq!(code, "S501", "{message}");
    assert!(message.contains("outside the allowed roots"), "{message}");

    let status = status(&stack, "shared").await;
    let tuning = &status["vm_tuning"];
    assert_eq!(tuning["requested"]["nested_virt"], true, "{status}");
    assert_eq!(tuning["requested"]["hyperthreading"], false, "{status}");
    assert_eq!(
        tuning["requested"]["virtiofs_shm_size_mib"], 128,
        "{status}"
    );
    // A bad value is ignored (the default stays) and the log says why.
    assert_eq!(tuning["requested"]["nofile_limit"], 65536, "{status}");
    let log = stack.adapter.log();
    assert!(log.contains("III_VM_NOFILE_LIMIT"), "{log}");

    // A Compose file that does not parse: logged with its reason, no declared root, and the
    // adapter serves all the same.
    std::fs::write(
        project.join("worker-compose.yaml"),
        "containers:\n  shared: {worker: 'path://../shared'\n",
    )
    .unwrap();
    stack.adapter.terminate();
    stack.restart_adapter(&options).await;
    let log = stack.adapter.log();
    assert!(log.contains("does not parse"), "{log}");
    let (code, _) = worker_err(
        &stack,
        "prepare",
        json!({"vm_id": "shared2", "image": "python", "host_path": base.path().join("shared")}),
    )
    .await;
    assert_eq!(code, "S501");
    prepare(&stack, "app2", &project.join("app")).await;
}

/// The libkrun lab's worker-VM test (`worker_vm_rounds`) on bwrap: a worker that connects back
/// to the engine and registers a function, called through the engine, `status`, a restart
/// after `kill -9` of the adapter, another loopback port refused, `logs`, `stop`, `destroy`;
/// `BWRAP_WORKER_ROUNDS` times (default 3).
#[tokio::test(flavor = "multi_thread")]
async fn worker_vms_connect_back_survive_an_adapter_kill_and_end_cleanly_round_after_round() {
    if !bwrap_usable("worker_vms_connect_back_survive_an_adapter_kill_and_end_cleanly") {
        return;
    }
    let rounds = std::env::var("BWRAP_WORKER_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let project = e2e_tests::host_dir();
    let compose = project.path().join("compose");
    std::fs::create_dir(&compose).unwrap();
    let options = worker_support::compose_options(&compose);
    let mut stack = Stack::start(json!({}), options.clone()).await;
    worker_support::worker_vm_rounds(&mut stack, &options, &compose, rounds, "bwrap").await;
}

/// A worker VM's `/proc/self/mountinfo` names no path of the host but its operator's share:
/// the adapter's state and cache, the adapter user's home and the adapter's binaries stay
/// unnamed, whichever way its layers are served (loop images as root, FUSE for an ordinary
/// user). The `host_path` bind is the operator's own choice of a host directory to share and
/// is shown as such.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_vm_mountinfo_names_no_host_path_but_its_share() {
    if !bwrap_usable("a_worker_vm_mountinfo_names_no_host_path_but_its_share") {
        return;
    }
    let project = Project::new();
    let stack = start_stack(&project, false).await;
    prepare(&stack, "mnt", &project.path("project/svc")).await;
    start_sh(
        &stack,
        "mnt",
        "cat /proc/self/mountinfo; echo mountinfo-end; sleep 60",
        json!({}),
    )
    .await;
    wait_log(&stack, "mnt", "mountinfo-end", 1, LOG_WAIT).await;
    let log = log_of(&stack, "mnt").await;
    let mountinfo = log.split("mountinfo-end").next().unwrap_or_default();
    println!("a worker VM's mountinfo:\n{mountinfo}");
    let named = sandbox_support::lines_naming_host_paths(&stack, mountinfo);
    assert!(named.is_empty(), "mountinfo names host paths: {named:#?}");
    worker_ok(&stack, "stop", json!({"vm_id": "mnt", "timeout_ms": 1000})).await;
}
