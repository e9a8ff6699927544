//! The escape suite: code in a sandbox or a worker VM tries what a hostile tenant
//! would (host root through the id mapping, `core_pattern`, kernel knobs, remounting
//! read-only mounts, new mounts, user namespaces, kernel interfaces, ptrace of the adapter,
//! setuid binaries, packet, raw and vsock sockets, io_uring) and every attempt must fail,
//! with the host's canaries unchanged: the attacks themselves are `escape_attacks.py`, run
//! by the python fixture image's python3.

mod sandbox_support;
mod worker_support;

use std::path::Path;
use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{
    assert_all_blocked, assert_only_entries, assert_plants_out_of_reach, create, exec_ok, stdout,
    Canary,
};
use serde_json::json;
use worker_support::{compose_options, wait_log, worker_ok};

const ATTACKS: &str = include_str!("escape_attacks.py");

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
    sandbox_support::assert_no_host_root_in_sandboxes(stack.adapter.pid());
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
        log.contains("planted /state/"),
        "the /state plant was made: {log}"
    );
    // The root's plant is in the worker's layer, which the host sees only for an ordinary-user
    // adapter (a root one keeps it in an ext4 image mounted in the launcher's namespace, and
    // /state with it).
    let found = assert_plants_out_of_reach(stack.state_dir.path(), stack.adapter.pid());
    if stack.worker_state_in_image().await {
        assert_eq!(found, 0, "a plant reached the host's state directory");
    } else {
        assert!(
            found >= 1,
            "the /state plant is in the worker's directory on the host"
        );
    }
    assert!(
        log.contains("write:/worker/escape.txt blocked"),
        "the /worker write was tried: {log}"
    );
    canary.assert_untouched();
    assert_only_entries(project.path(), &["main.txt"]);
}

/// A sandbox's mountinfo tells its guest nothing of the host's layout: no line names the
/// adapter's state or cache directory, its user's home, or where the agent and the adapter's
/// binaries live (the launcher stages the overlay's layers under neutral names and copies
/// the agent, and a networked sandbox's resolv.conf, onto its stage).
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_mountinfo_names_no_host_path() {
    // The VM lab runs it on microVMs (`SANDBOX_E2E_PLUGIN=libkrun`): a guest's kernel sees its
    // virtio-fs shares by their tags, which must name nothing of the host either.
    let libkrun = std::env::var("SANDBOX_E2E_PLUGIN").is_ok_and(|p| p == "libkrun");
    if !libkrun && !bwrap_usable("a_sandbox_mountinfo_names_no_host_path") {
        return;
    }
    let stack = if libkrun {
        let options = e2e_tests::AdapterOptions {
            plugin: e2e_tests::PluginKind::Libkrun,
            prefix: None,
            ..e2e_tests::AdapterOptions::default()
        };
        Stack::start(json!({}), options).await
    } else {
        Stack::bwrap().await
    };
    for network in [false, true] {
        let id = create(&stack, "python", json!({ "network": network })).await;
        let answer = exec_ok(&stack, &id, json!({"cmd": "cat /proc/self/mountinfo"})).await;
        let mountinfo = stdout(&answer);
        println!("mountinfo of a sandbox with network {network}:\n{mountinfo}");
        assert!(mountinfo.contains(" / / "), "no root in {mountinfo}");
        let named = sandbox_support::lines_naming_host_paths(&stack, mountinfo);
        assert!(named.is_empty(), "mountinfo names host paths: {named:#?}");
    }
}

#[test]
fn a_path_is_named_whole() {
    use sandbox_support::names_path;
    let overlay = "131 71 0:41 / / rw - overlay overlay rw,lowerdir=/srv/a/lower:/x,upperdir=/y";
    assert!(names_path(overlay, "/srv/a"));
    assert!(names_path(overlay, "/x"));
    assert!(!names_path(overlay, "/srv/ab"));
    assert!(!names_path(
        "21 1 0:20 / / rw - virtiofs /dev/root rw",
        "/root"
    ));
    assert!(names_path(
        "143 131 0:40 /root/agent /.iii-agent ro - tmpfs",
        "/root"
    ));
}
