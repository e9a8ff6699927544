//! Idle reaping end to end: a sandbox idle past its timeout (its own, or the configured
//! default) is stopped and its layer removed; one with a call in flight is never reaped.

mod sandbox_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{
    cgroup_name, cgroups_named, create, eventually, exec, exec_ok, expect_err, live_ids, sh, stop,
};
use serde_json::json;

/// Far above the idle timeouts used here: the reaper runs every half second.
const REAP_WITHIN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread")]
async fn idle_sandboxes_are_reaped_after_their_own_or_the_default_timeout() {
    if !bwrap_usable("idle_sandboxes_are_reaped_after_their_own_or_the_default_timeout") {
        return;
    }
    let stack = Stack::start(json!({"default_idle_timeout_secs": 2}), Default::default()).await;
    let own = create(&stack, "python", json!({"idle_timeout_secs": 1})).await;
    let default = create(&stack, "python", json!({})).await;
    let kept = create(&stack, "python", json!({"idle_timeout_secs": 600})).await;
    let layer = |id: &str| stack.state_dir.path().join("sandboxes").join(id);
    assert!(layer(&own).is_dir() && layer(&default).is_dir());
    let groups = [cgroup_name(&stack, &own), cgroup_name(&stack, &default)];

    let reaped = eventually(REAP_WITHIN, || async {
        let live = live_ids(&stack).await;
        !live.contains(&own) && !live.contains(&default)
    })
    .await;
    assert!(
        reaped,
        "idle sandboxes still listed: {:?}",
        live_ids(&stack).await
    );
    assert!(
        live_ids(&stack).await.contains(&kept),
        "a sandbox with a long idle timeout is kept"
    );
    let (code, body) = expect_err(exec(&stack, &own, sh("true")).await, "exec after reaping");
    assert_eq!(code, "S004", "a reaped sandbox counts as stopped: {body}");
    let cleaned = eventually(REAP_WITHIN, || async {
        !layer(&own).exists() && !layer(&default).exists()
    })
    .await;
    assert!(cleaned, "reaped sandboxes left their layers");
    let left: Vec<_> = groups.iter().flat_map(|g| cgroups_named(g)).collect();
    assert!(
        left.is_empty(),
        "reaped sandboxes left their cgroups: {left:?}"
    );
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["in_flight"], 1, "{list}");
    let answer = stop(&stack, &own, false).await;
    assert_eq!(
        answer["stopped"], true,
        "stop of a reaped sandbox answers stopped"
    );
    stop(&stack, &kept, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_exec_is_not_reaped_mid_call_and_the_sandbox_is_reaped_after() {
    if !bwrap_usable("a_long_exec_is_not_reaped_mid_call_and_the_sandbox_is_reaped_after") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({"idle_timeout_secs": 1})).await;
    let finished = AtomicBool::new(false);
    // An exec four times longer than the idle timeout, and meanwhile `list` sampled until it
    // returns: the sandbox must be listed, busy, in every sample.
    let long_exec = async {
        let result = exec_ok(&stack, &id, sh("sleep 4; echo finished")).await;
        finished.store(true, Ordering::SeqCst);
        result
    };
    let sampler = async {
        let mut samples = 0;
        let mut missing = Vec::new();
        tokio::time::sleep(Duration::from_millis(200)).await;
        while !finished.load(Ordering::SeqCst) {
            let list = stack.call("list", json!({})).await.expect("list");
            let entry = list["sandboxes"]
                .as_array()
                .and_then(|all| all.iter().find(|s| s["sandbox_id"] == id.as_str()).cloned());
            let busy = entry.as_ref().is_some_and(|s| s["exec_in_flight"] == 1);
            if !busy && !finished.load(Ordering::SeqCst) {
                missing.push(list);
            }
            samples += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (samples, missing)
    };
    let (result, (samples, missing)) = tokio::join!(long_exec, sampler);
    assert_eq!(result["stdout"], "finished\n", "{result}");
    assert_eq!(result["exit_code"], 0);
    assert!(
        samples >= 5,
        "sampled the list during the exec ({samples} samples)"
    );
    assert!(missing.is_empty(), "reaped or idle mid-call: {missing:?}");

    let reaped = eventually(REAP_WITHIN, || async {
        !live_ids(&stack).await.contains(&id)
    })
    .await;
    assert!(reaped, "the sandbox is reaped once the exec is over");
    let layer = stack.state_dir.path().join("sandboxes").join(&id);
    assert!(
        eventually(REAP_WITHIN, || async { !layer.exists() }).await,
        "its layer is removed"
    );
}
