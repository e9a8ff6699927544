//! The escape suite (issue 8): code in a sandbox or a worker VM tries what a hostile tenant
//! would (host root through the id mapping, `core_pattern`, kernel knobs, remounting
//! read-only mounts, new mounts, user namespaces, kernel interfaces, ptrace of the adapter,
//! setuid binaries) and every attempt must fail, with the host's canaries unchanged: the
//! attacks themselves are `escape_attacks.py`, run by the python fixture image's python3.

mod sandbox_support;
mod worker_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{assert_all_blocked, create, exec_ok, stdout};
use serde_json::json;
use worker_support::{compose_options, wait_log, worker_ok};

const ATTACKS: &str = include_str!("escape_attacks.py");

/// A host file an attack would change, with what it held.
struct Canary {
    path: PathBuf,
    content: Vec<u8>,
    modified: SystemTime,
}

impl Canary {
    fn plant(dir: &Path, name: &str) -> Canary {
        let path = dir.join(name);
        std::fs::write(&path, format!("canary {name}: untouched\n")).unwrap();
        Canary::of(&path)
    }

    fn of(path: &Path) -> Canary {
        Canary {
            path: path.to_path_buf(),
            content: std::fs::read(path).unwrap(),
            modified: std::fs::metadata(path).unwrap().modified().unwrap(),
        }
    }

    fn assert_untouched(&self) {
        let now = Canary::of(&self.path);
        assert_eq!(
            String::from_utf8_lossy(&now.content),
            String::from_utf8_lossy(&self.content),
            "{} changed",
            self.path.display()
        );
        assert_eq!(
            now.modified,
            self.modified,
            "{} was written",
            self.path.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_cannot_escape_to_the_host() {
    if !bwrap_usable("a_sandbox_cannot_escape_to_the_host") {
        return;
    }
    let host = e2e_tests::host_dir();
    let canary = Canary::plant(host.path(), "canary.txt");
    let core_pattern = Canary::of(Path::new("/proc/sys/kernel/core_pattern"));
    let stack = Stack::bwrap().await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let isolation = &info["backend"]["isolation"];
    assert_eq!(isolation["host_root_in_sandbox"], false, "{info}");
    assert_eq!(isolation["seccomp"], true, "{info}");
    println!("isolation in force: {isolation}");
    let id = create(&stack, "python", json!({})).await;
    let answer = exec_ok(
        &stack,
        &id,
        json!({"argv": ["python3", "-c", ATTACKS, canary.path, stack.adapter.pid().to_string()],
               "timeout_ms": 60000}),
    )
    .await;
    let context = format!("stderr: {}\n{}", answer["stderr"], stack.adapter.log());
    assert_all_blocked(stdout(&answer), &context);
    canary.assert_untouched();
    assert_eq!(
        std::fs::read(&core_pattern.path).unwrap(),
        core_pattern.content,
        "the host's core_pattern changed"
    );
    // The sandbox still serves after all that.
    let ok = exec_ok(&stack, &id, json!({"cmd": "echo ok"})).await;
    assert_eq!(stdout(&ok), "ok\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_vm_cannot_write_its_read_only_mounts_or_escape() {
    if !bwrap_usable("a_worker_vm_cannot_write_its_read_only_mounts_or_escape") {
        return;
    }
    let project = e2e_tests::host_dir();
    let canary = Canary::plant(project.path(), "main.txt");
    let stack = Stack::start(json!({}), compose_options(project.path())).await;
    worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": "escape", "image": "python", "host_path": project.path()}),
    )
    .await;
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": "escape",
               "command": ["python3", "-c", ATTACKS, canary.path, stack.adapter.pid().to_string()]}),
    )
    .await;
    let log = wait_log(&stack, "escape", "done ", 1, Duration::from_secs(90)).await;
    assert_all_blocked(&log, &stack.adapter.log());
    assert!(
        log.contains("write:/worker/escape.txt blocked"),
        "the /worker write was tried: {log}"
    );
    canary.assert_untouched();
    let entries: Vec<_> = std::fs::read_dir(project.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        entries,
        ["main.txt"],
        "nothing new in the host's project dir"
    );
}
