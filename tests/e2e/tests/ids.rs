//! The ids a sandbox has on the bwrap plugin: a root adapter maps 65536 of them onto
//! an unprivileged host range; an ordinary user's adapter maps its own id as root and, when
//! the user has subordinate ranges and `uidmap`'s helpers, ids 1..65535 onto those ranges.
//! Either way a program that switches to another uid does what `adapter::info` promises, what
//! it writes is no host user's, and the adapter still removes it.

mod sandbox_support;
mod worker_support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{create, eventually, exec_ok, stdout};
use serde_json::json;
use worker_support::{compose_options, wait_log, worker_ok};

/// Switches to uid/gid 1000 and writes a file in a directory only that uid may enter;
/// prints `switched UID GID` or `refused ERRNO`.
const SWITCH: &str = r#"
import os, sys
target = sys.argv[1]
try:
    os.makedirs(target, exist_ok=True)
    os.chown(target, 1000, 1000)
    os.chmod(target, 0o700)
    os.setgroups([])
    os.setgid(1000)
    os.setuid(1000)
    with open(os.path.join(target, "mine"), "w") as f:
        f.write("written as 1000\n")
    print("switched", os.getuid(), os.getgid())
except OSError as e:
    print("refused", e.errno)
"#;

async fn ids_in_sandbox(stack: &Stack) -> u64 {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let isolation = &info["backend"]["isolation"];
    println!("ids in force: {}", isolation["user_namespace"]);
    isolation["ids_in_sandbox"]
        .as_u64()
        .unwrap_or_else(|| panic!("adapter::info names no ids_in_sandbox: {info}"))
}

/// The host owner of `path` is no one the host knows as a person or as the adapter.
fn assert_owned_by_an_unprivileged_range(path: &Path) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    let adapter_uid = e2e_tests::adapter_user().map_or(0, |user| user.uid);
    assert!(
        meta.uid() != 0 && meta.uid() != adapter_uid && meta.uid() >= 65536,
        "{} is host uid {} (adapter {adapter_uid})",
        path.display(),
        meta.uid()
    );
    assert!(meta.gid() != 0 && meta.gid() >= 65536, "gid {}", meta.gid());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_program_switching_uid_in_a_sandbox_does_what_adapter_info_says() {
    let test = "a_program_switching_uid_in_a_sandbox_does_what_adapter_info_says";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::bwrap().await;
    let ids = ids_in_sandbox(&stack).await;
    let id = create(&stack, "python", json!({})).await;
    let answer = exec_ok(
        &stack,
        &id,
        json!({"argv": ["python3", "-c", SWITCH, "/srv/own"], "timeout_ms": 30000}),
    )
    .await;
    let out = stdout(&answer);
    if ids > 1 {
        assert_eq!(out, "switched 1000 1000\n", "{answer}");
        let listed = exec_ok(&stack, &id, json!({"cmd": "stat -c '%u:%g %a' /srv/own"})).await;
        assert_eq!(stdout(&listed), "1000:1000 700\n");
    } else {
        // Only the sandbox's root exists: setgroups and setgid to an unmapped id are EINVAL
        // or EPERM, never a silent success.
        assert!(
            out == "refused 22\n" || out == "refused 1\n",
            "with one id the switch must fail: {answer}"
        );
        println!("{test}: one id in the sandbox: the switch was refused, as adapter::info says");
    }
    // The layer, with whatever uid 1000 wrote in it, is gone after stop.
    let layer = stack.state_dir.path().join("sandboxes").join(&id);
    stack
        .call("stop", json!({"sandbox_id": id}))
        .await
        .expect("stop");
    let gone = eventually(Duration::from_secs(20), || async { !layer.exists() }).await;
    assert!(gone, "layer left behind\n{}", stack.adapter.log());
}

/// A worker whose guest writes as uid 1000 into `/state` and its root leaves files the
/// adapter's own user does not own (an ordinary user's subordinate ids, a root adapter's
/// range); `destroy` still removes all of it.
#[tokio::test(flavor = "multi_thread")]
async fn what_a_worker_writes_as_another_uid_is_no_host_users_and_destroy_removes_it() {
    let test = "what_a_worker_writes_as_another_uid_is_no_host_users_and_destroy_removes_it";
    if !bwrap_usable(test) {
        return;
    }
    let project = e2e_tests::host_dir();
    std::fs::write(project.path().join("main.txt"), "hello\n").unwrap();
    let stack = Stack::start(json!({}), compose_options(project.path())).await;
    let ids = ids_in_sandbox(&stack).await;
    if ids <= 1 {
        println!(
            "\n*** {test} DID NOT RUN: the sandbox has one id (no subordinate ranges or no \
             uidmap helpers for the adapter's user), so no program can switch uid ***\n"
        );
        return;
    }
    worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": "ids", "image": "python", "host_path": project.path()}),
    )
    .await;
    // SWITCH holds no single quote, so it goes into the shell as one quoted word.
    let script =
        format!("python3 -c '{SWITCH}' /state/app && python3 -c '{SWITCH}' /srv/own; echo done");
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": "ids", "command": ["/bin/sh", "-c", script]}),
    )
    .await;
    let worker = stack.state_dir.path().join("workers").join("ids");
    let log = wait_log(&stack, "ids", "done", 1, Duration::from_secs(60)).await;
    assert_eq!(
        log.matches("switched 1000 1000").count(),
        2,
        "both writes as uid 1000: {log}"
    );
    worker_ok(&stack, "stop", json!({"vm_id": "ids", "timeout_ms": 5000})).await;
    if stack.worker_state_in_image().await {
        // A root adapter's /state is in the layer image: no host file of it to check.
        assert!(!worker.join("data/app").exists(), "/state reached the host");
    } else {
        assert_owned_by_an_unprivileged_range(&worker.join("data/app"));
    }
    worker_ok(&stack, "destroy", json!({"vm_id": "ids"})).await;
    assert!(
        !worker.exists(),
        "destroy left {}\n{}",
        worker.display(),
        stack.adapter.log()
    );
}
