//! No orphans end to end: `kill -9` of the adapter with three live sandboxes (one running a
//! program) leaves no sandbox process on the host; the next start with the same state
//! directory cleans the three leftover layers and reports them in `list.reconciled`.

mod sandbox_support;

use std::time::Duration;

use e2e_tests::{bwrap_usable, AdapterOptions, Stack};
use sandbox_support::{
    cgroup_name, cgroups_named, create, descendants, eventually, exec, layers_on_disk, sh,
    HostProcess,
};
use serde_json::json;

/// Agent binary's name inside the sandbox (what `comm` shows on the host).
const AGENT_COMM: &str = ".iii-agent";

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_leaves_no_sandbox_process_and_restart_reconciles_three() {
    if !bwrap_usable("kill_9_leaves_no_sandbox_process_and_restart_reconciles_three") {
        return;
    }
    let mut stack = Stack::bwrap().await;
    let ids = [
        create(&stack, "python", json!({})).await,
        create(&stack, "python", json!({})).await,
        create(&stack, "node", json!({})).await,
    ];
    assert_eq!(layers_on_disk(&stack), 3);
    let groups: Vec<String> = ids.iter().map(|id| cgroup_name(&stack, id)).collect();
    let adapter_pid = stack.adapter.pid();

    // One sandbox runs a program; record the whole tree under the adapter once it is there.
    let recorded: Vec<HostProcess> = tokio::select! {
        result = exec(&stack, &ids[0], sh("exec sleep 1000")) => {
            panic!("the long exec ended early: {result:?}")
        }
        tree = async {
            let seen = eventually(Duration::from_secs(30), || async {
                descendants(adapter_pid).iter().any(|p| p.comm == "sleep")
            })
            .await;
            assert!(seen, "the exec's sleep never showed up: {:?}", descendants(adapter_pid));
            descendants(adapter_pid)
        } => tree,
    };
    let named = |name: &str| recorded.iter().filter(|p| p.comm == name).count();
    assert!(
        named("bwrap") >= 3,
        "one bwrap per sandbox at least: {recorded:?}"
    );
    assert_eq!(named(AGENT_COMM), 3, "one agent per sandbox: {recorded:?}");

    stack.adapter.kill9();
    let all_gone = eventually(Duration::from_secs(10), || async {
        recorded.iter().all(|p| !p.is_alive())
    })
    .await;
    let survivors: Vec<&HostProcess> = recorded.iter().filter(|p| p.is_alive()).collect();
    assert!(
        all_gone,
        "sandbox processes outlived the adapter: {survivors:?}"
    );
    assert_eq!(layers_on_disk(&stack), 3, "nobody cleaned up yet");

    // A new adapter over the same configuration (same state directory).
    stack.restart_adapter(&AdapterOptions::default()).await;

    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["reconciled"], 3, "{list}");
    assert_eq!(list["sandboxes"], json!([]), "{list}");
    assert_eq!(list["in_flight"], 0, "{list}");
    assert_eq!(
        layers_on_disk(&stack),
        0,
        "leftover layers were removed at start-up"
    );
    let left: Vec<_> = groups.iter().flat_map(|g| cgroups_named(g)).collect();
    assert!(left.is_empty(), "leftover cgroups: {left:?}");
    for id in &ids {
        let (code, _) = sandbox_support::expect_err(
            exec(&stack, id, sh("true")).await,
            "exec in a sandbox of the dead adapter",
        );
        assert_eq!(code, "S002", "a new adapter run does not know old ids");
    }
    // And it serves as usual.
    let run = stack
        .call(
            "run",
            json!({"image": "python", "code": "print(6*7)", "lang": "python"}),
        )
        .await
        .expect("run after restart");
    assert_eq!(run["stdout"], "42\n");
}

/// The orderly way out: SIGTERM stops every sandbox (processes, layers, cgroups) before the
/// adapter exits 0, so the next start has nothing to reconcile.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_every_sandbox_before_exiting() {
    if !bwrap_usable("sigterm_stops_every_sandbox_before_exiting") {
        return;
    }
    let mut stack = Stack::bwrap().await;
    let ids = [
        create(&stack, "python", json!({})).await,
        create(&stack, "node", json!({})).await,
    ];
    assert_eq!(layers_on_disk(&stack), 2);
    let groups: Vec<String> = ids.iter().map(|id| cgroup_name(&stack, id)).collect();
    let recorded = descendants(stack.adapter.pid());
    assert_eq!(
        recorded.iter().filter(|p| p.comm == AGENT_COMM).count(),
        2,
        "{recorded:?}"
    );

    let status = stack
        .adapter
        .terminate()
        .expect("the adapter exits on SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", stack.adapter.log());
    let survivors: Vec<&HostProcess> = recorded.iter().filter(|p| p.is_alive()).collect();
    assert!(
        survivors.is_empty(),
        "still alive after exit: {survivors:?}"
    );
    assert_eq!(layers_on_disk(&stack), 0, "layers removed before exit");
    let left: Vec<_> = groups.iter().flat_map(|g| cgroups_named(g)).collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}
