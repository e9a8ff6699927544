//! Limits end to end on the bwrap plugin: `max_concurrent_sandboxes`, the per-sandbox exec cap,
//! per-image caps, unknown and stopped sandboxes, idempotent `stop` and `stop {wait}`.

mod sandbox_support;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{
    cgroup_name, cgroups_named, create, exec, exec_ok, expect_err, layers_on_disk, live_ids,
    pids_groups, sh, stop,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn the_33rd_create_is_s400_and_a_stop_frees_a_slot() {
    if !bwrap_usable("the_33rd_create_is_s400_and_a_stop_frees_a_slot") {
        return;
    }
    let stack = Stack::bwrap().await;
    let ids: Vec<String> =
        futures::future::join_all((0..32).map(|_| create(&stack, "python", json!({})))).await;
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["in_flight"], 32, "{list}");
    assert_eq!(list["cap"], 32, "{list}");
    assert_eq!(list["remaining"], 0, "{list}");
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(32));

    let (code, body) = expect_err(
        stack.call("create", json!({"image": "python"})).await,
        "33rd create",
    );
    assert_eq!(code, "S400", "{body}");
    assert_eq!(body["retryable"], true, "{body}");
    // `run` takes a slot like `create` does.
    let (code, body) = expect_err(
        stack
            .call(
                "run",
                json!({"image": "python", "code": "print(1)", "lang": "python"}),
            )
            .await,
        "run at the cap",
    );
    assert_eq!(code, "S400", "{body}");

    let mut groups: Vec<String> = ids.iter().map(|id| cgroup_name(&stack, id)).collect();
    let enforced = !cgroups_named(&groups[0]).is_empty();
    if enforced {
        // `max_pids_per_sandbox` (1024), or fewer where the host's fs.file-max cannot give
        // 32 sandboxes that many processes at their open-file limit (info says how many).
        let info = stack.call("adapter::info", json!({})).await.expect("info");
        let pids = &info["backend"]["isolation"]["ceilings"]["open_files"]["pids"];
        limits_are_in_force(&groups[0], &pids.to_string());
    } else {
        println!(
            "*** no writable cgroup hierarchy here: cgroup limits and cleanup NOT checked ***"
        );
    }

    // A stop frees the slot for the next create.
    stop(&stack, &ids[0], true).await;
    let again = create(&stack, "python", json!({})).await;
    groups.push(cgroup_name(&stack, &again));
    let (code, _) = expect_err(
        stack.call("create", json!({"image": "python"})).await,
        "create at the cap again",
    );
    assert_eq!(code, "S400");

    // Clean up: every sandbox stopped, nothing left on disk.
    futures::future::join_all(
        ids[1..]
            .iter()
            .chain(std::iter::once(&again))
            .map(|id| stop(&stack, id, true)),
    )
    .await;
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["sandboxes"], json!([]), "{list}");
    assert_eq!(list["in_flight"], 0, "{list}");
    assert_eq!(list["remaining"], 32, "{list}");
    assert_eq!(layers_on_disk(&stack), 0, "no layer left on disk");
    let left: Vec<_> = groups.iter().flat_map(|g| cgroups_named(g)).collect();
    assert!(
        left.is_empty(),
        "cgroups left after stop {{wait}}: {left:?}"
    );
}

/// The defaults (1 cpu, 512 MiB) are written to the sandbox's group, and the sandbox's
/// processes (bwrap and the agent under it) are in the group, not only next to it.
fn limits_are_in_force(group: &str, pids_max: &str) {
    let mut members = 0;
    for dir in cgroups_named(group) {
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
        if let Some(memory) = read("memory.max").or_else(|| read("memory.limit_in_bytes")) {
            assert_eq!(
                memory.trim(),
                (512u64 << 20).to_string(),
                "{}",
                dir.display()
            );
        }
        if let Some(cpu) = read("cpu.max") {
            assert_eq!(cpu.trim(), "100000 100000", "{}", dir.display());
        }
        if let Some(quota) = read("cpu.cfs_quota_us") {
            assert_eq!(quota.trim(), "100000", "{}", dir.display());
        }
        let procs = read("cgroup.procs").unwrap_or_default();
        assert!(
            procs.lines().count() >= 2,
            "bwrap and the agent are in {}: {procs:?}",
            dir.display()
        );
        members += 1;
    }
    assert!(members > 0, "group {group} has no hierarchy");
    // The pids limit (`max_pids_per_sandbox`, default 1024, within the open-file budget): in
    // the v2 group, or the v1 `pids` hierarchy.
    let pids = pids_groups(group).pop().expect("a pids group");
    let max = std::fs::read_to_string(pids.join("pids.max")).unwrap_or_default();
    assert_eq!(max.trim(), pids_max, "{}", pids.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_cap_image_caps_unknown_and_stopped_sandboxes() {
    if !bwrap_usable("exec_cap_image_caps_unknown_and_stopped_sandboxes") {
        return;
    }
    // Ceilings above the caps, so that what is checked is the per-image caps (the default
    // ceilings come from the host: its cores, half its memory).
    let stack = Stack::start(
        json!({
            "per_image_caps": {"python": {"max_cpus": 2, "max_memory_mb": 1024}},
            "max_cpus": 8, "max_memory_mb": 4096,
        }),
        Default::default(),
    )
    .await;

    // Per-image caps: above them S400, at them fine; other images are not capped.
    for (extra, what) in [
        (json!({"cpus": 3}), "cpus above the cap"),
        (json!({"memory_mb": 1025}), "memory above the cap"),
        (
            json!({"cpus": 2, "memory_mb": 2048}),
            "memory above, cpus at the cap",
        ),
    ] {
        let mut payload = json!({"image": "python"});
        payload
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (code, body) = expect_err(stack.call("create", payload).await, what);
        assert_eq!(code, "S400", "{what}: {body}");
    }
    let id = create(&stack, "python", json!({"cpus": 2, "memory_mb": 1024})).await;
    let node = create(&stack, "node", json!({"cpus": 3, "memory_mb": 2048})).await;
    stop(&stack, &node, true).await;

    // Five execs at once with the default cap of four: four results and one S003. The four
    // hold their slots until the test lets them go (a file written with fs::write, which
    // takes no exec slot), so a fifth call that reaches the adapter late on a loaded machine
    // still finds the cap full.
    let mut held = sh("while [ ! -e /tmp/release ]; do sleep 0.05; done; echo done");
    held["timeout_ms"] = json!(120_000);
    let release = async {
        let four_running =
            sandbox_support::eventually(std::time::Duration::from_secs(60), || async {
                let list = stack.call("list", json!({})).await.expect("list");
                list["sandboxes"].as_array().is_some_and(|all| {
                    all.iter()
                        .any(|s| s["sandbox_id"] == id.as_str() && s["exec_in_flight"] == 4)
                })
            })
            .await;
        // Released in any case, so that a failure below is an assertion, not a hang.
        let released = stack
            .call(
                "fs::write",
                json!({"sandbox_id": id, "path": "/tmp/release", "content_b64": ""}),
            )
            .await;
        (four_running, released)
    };
    let (results, (four_running, released)) = tokio::join!(
        futures::future::join_all((0..5).map(|_| exec(&stack, &id, held.clone()))),
        release
    );
    assert!(four_running, "four execs never held the four slots");
    let released = released.expect("fs::write while the exec slots are full");
    assert_eq!(released["bytes_written"], 0, "{released}");
    let done = results
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|v| v["stdout"] == "done\n"))
        .count();
    let refused: Vec<(String, serde_json::Value)> = results
        .into_iter()
        .filter(Result::is_err)
        .map(|r| expect_err(r, "fifth exec"))
        .collect();
    assert_eq!(done, 4, "four execs ran: {refused:?}");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "S003", "{refused:?}");
    assert_eq!(refused[0].1["retryable"], true, "{refused:?}");
    // The slots are back once the four are done.
    let after = exec_ok(&stack, &id, json!({"argv": ["echo", "free"]})).await;
    assert_eq!(after["stdout"], "free\n");

    // Ids never seen are S002, for exec and for stop.
    let stranger = "3f2504e0-4f89-41d3-9a0c-0305e82c3301";
    let (code, _) = expect_err(exec(&stack, stranger, sh("true")).await, "unknown exec");
    assert_eq!(code, "S002");
    let (code, _) = expect_err(
        stack.call("stop", json!({"sandbox_id": stranger})).await,
        "unknown stop",
    );
    assert_eq!(code, "S002");

    // Stop is idempotent; calls on a stopped sandbox are S004.
    let first = stop(&stack, &id, false).await;
    assert_eq!(first, json!({"sandbox_id": id, "stopped": true}));
    let second = stop(&stack, &id, false).await;
    assert_eq!(second, json!({"sandbox_id": id, "stopped": true}));
    let (code, body) = expect_err(exec(&stack, &id, sh("true")).await, "exec after stop");
    assert_eq!(code, "S004", "{body}");
    assert!(!live_ids(&stack).await.contains(&id));

    // A stop during an exec ends that exec with S004 instead of leaving it hanging.
    let busy = create(&stack, "python", json!({})).await;
    let mut long = sh("echo started; sleep 1000");
    long["timeout_ms"] = json!(120_000);
    let (interrupted, _) = tokio::join!(exec(&stack, &busy, long), async {
        let running = sandbox_support::eventually(std::time::Duration::from_secs(30), || async {
            let list = stack.call("list", json!({})).await.expect("list");
            list["sandboxes"].as_array().is_some_and(|all| {
                all.iter()
                    .any(|s| s["sandbox_id"] == busy.as_str() && s["exec_in_flight"] == 1)
            })
        })
        .await;
        assert!(running, "the long exec never showed in list");
        stop(&stack, &busy, true).await
    });
    let (code, body) = expect_err(interrupted, "exec interrupted by stop");
    assert_eq!(code, "S004", "{body}");

    // `wait`: once it answers, the sandbox and its layer are gone.
    let waited = create(&stack, "python", json!({})).await;
    let layer = stack.state_dir.path().join("sandboxes").join(&waited);
    assert!(layer.is_dir(), "a live sandbox has its layer");
    let answer = stop(&stack, &waited, true).await;
    assert_eq!(answer["stopped"], true);
    assert!(
        !layer.exists(),
        "stop {{wait: true}} returned before the layer was removed"
    );
    assert!(!live_ids(&stack).await.contains(&waited));
    let again = stop(&stack, &waited, true).await;
    assert_eq!(
        again["stopped"], true,
        "waiting on a stopped sandbox is fine too"
    );
}
