//! `pause` and `resume` end to end on the bwrap backend: a paused sandbox's busy program uses
//! no CPU (the host's /proc counters of every process in the sandbox's cgroup) and continues
//! where it stood after `resume`; `list` shows it paused; an `exec` on a paused sandbox
//! resumes it; `stop` ends a paused one with nothing left behind; `max_paused_secs` stops
//! one paused too long.
//!
//! The freezer is the cgroup's own (v2) or the v1 freezer hierarchy. An ordinary user's
//! adapter on a cgroup v1 host has no freezer group of its own (tests/e2e/delegate-cgroup.sh
//! delegates memory, cpu and pids only): there `pause` must answer S310 naming the freezer,
//! and the rest of the test cannot run.

mod sandbox_support;

use std::time::Duration;

use e2e_tests::{adapter_user, bwrap_usable, s_code, Stack};
use sandbox_support::{
    cgroup_name, cgroups_named, cpu_ticks, create, eventually, exec, exec_ok, expect_err, live_ids,
    sh, stdout, stop, BUSY_COUNTER,
};
use serde_json::{json, Value};

/// CPU time (clock ticks, user + system) of every process in the sandbox's cgroup, as the
/// host's /proc counts it; and how many processes there were.
fn sandbox_cpu_ticks(group: &str) -> (u64, usize) {
    let dir = cgroups_named(group)
        .into_iter()
        .find(|d| d.join("cgroup.procs").is_file() && !d.starts_with("/sys/fs/cgroup/freezer"))
        .unwrap_or_else(|| panic!("no cgroup named {group}"));
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).expect("cgroup.procs");
    let mut ticks = 0;
    let mut count = 0;
    for pid in procs.lines() {
        if let Some(own) = pid.trim().parse().ok().and_then(cpu_ticks) {
            ticks += own;
            count += 1;
        }
    }
    (ticks, count)
}

async fn count(stack: &Stack, id: &str) -> u64 {
    let out = exec_ok(stack, id, sh("cat /tmp/count 2>/dev/null || echo 0")).await;
    stdout(&out).trim().parse().unwrap_or(0)
}

fn listed_paused(list: &Value, id: &str) -> Option<bool> {
    list["sandboxes"]
        .as_array()?
        .iter()
        .find(|s| s["sandbox_id"] == id)?["paused"]
        .as_bool()
}

/// Pauses `id`; `None` (after saying why) where this adapter cannot, which only an ordinary
/// user's adapter on a cgroup v1 host may answer.
async fn pause_or_explain(stack: &Stack, id: &str, test: &str) -> Option<Value> {
    match stack.call("pause", json!({"sandbox_id": id})).await {
        Ok(answer) => Some(answer),
        Err(e) if s_code(&e) == "S310" && adapter_user().is_some() => {
            let body = e2e_tests::error_body(&e);
            let message = body["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("freezer"),
                "S310 names the freezer: {body}"
            );
            println!(
                "\n*** {test} DID NOT RUN past S310: this ordinary user's adapter has no \
                 cgroup freezer ({message}) ***\n"
            );
            None
        }
        Err(e) => panic!("pause: {e:?}\n{}", stack.adapter.log()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_uses_no_cpu_and_continues_where_it_stood() {
    let test = "a_paused_sandbox_uses_no_cpu_and_continues_where_it_stood";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({"idle_timeout_secs": 600})).await;
    let group = cgroup_name(&stack, &id);
    let counter_pid = stdout(&exec_ok(&stack, &id, sh(BUSY_COUNTER)).await)
        .trim()
        .to_string();
    // It runs: its count grows, and so does the sandbox's CPU time.
    assert!(
        eventually(Duration::from_secs(20), || async {
            count(&stack, &id).await > 0
        })
        .await,
        "the counter never counted"
    );
    let (cpu_before, _) = sandbox_cpu_ticks(&group);
    let counted_before = count(&stack, &id).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rate = count(&stack, &id).await - counted_before; // steps in about a second
    let (cpu_running, _) = sandbox_cpu_ticks(&group);
    assert!(
        cpu_running > cpu_before + 5,
        "the busy loop uses CPU while running: {cpu_before} -> {cpu_running} ticks"
    );
    assert!(rate > 0, "the counter counts while running");

    let at_pause = count(&stack, &id).await;
    let Some(answer) = pause_or_explain(&stack, &id, test).await else {
        stop(&stack, &id, true).await;
        return;
    };
    assert_eq!(answer, json!({"sandbox_id": id, "paused": true}));
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(listed_paused(&list, &id), Some(true), "{list}");
    // Pausing again is a no-op that says so.
    let again = stack
        .call("pause", json!({"sandbox_id": id}))
        .await
        .unwrap();
    assert_eq!(again["paused"], true);

    let (frozen_at, processes) = sandbox_cpu_ticks(&group);
    assert!(
        processes >= 2,
        "the sandbox's processes are counted ({processes})"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (frozen_after, _) = sandbox_cpu_ticks(&group);
    assert!(
        frozen_after <= frozen_at + 1,
        "a paused sandbox uses no CPU: {frozen_at} -> {frozen_after} ticks in 5 s"
    );
    // The idle timer does not run and it is still live.
    assert!(live_ids(&stack).await.contains(&id));

    let resumed = stack
        .call("resume", json!({"sandbox_id": id}))
        .await
        .expect("resume");
    assert_eq!(resumed, json!({"sandbox_id": id, "paused": false}));
    let at_resume = count(&stack, &id).await;
    // In the 5 s paused, a running counter would have gone about 5 * rate further.
    assert!(
        at_resume >= at_pause && at_resume - at_pause < rate * 5 / 2,
        "the counter stood still while paused: {at_pause} at the pause, {at_resume} after \
         the resume, about {rate} a second while running"
    );
    // The same program continues from there.
    let alive = exec_ok(
        &stack,
        &id,
        sh(&format!("kill -0 {counter_pid} && echo alive")),
    )
    .await;
    assert_eq!(stdout(&alive).trim(), "alive");
    assert!(
        eventually(Duration::from_secs(10), || async {
            count(&stack, &id).await > at_resume
        })
        .await,
        "the counter continues after resume"
    );
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(listed_paused(&list, &id), Some(false), "{list}");

    // Resuming a running sandbox is a no-op; bad ids are the usual errors.
    let again = stack
        .call("resume", json!({"sandbox_id": id}))
        .await
        .unwrap();
    assert_eq!(again["paused"], false);
    let unknown = json!({"sandbox_id": uuid_never_seen()});
    let (code, _) = expect_err(stack.call("pause", unknown).await, "pause unknown");
    assert_eq!(code, "S002");
    let (code, _) = expect_err(
        stack.call("pause", json!({"sandbox_id": "nope"})).await,
        "pause bad id",
    );
    assert_eq!(code, "S001");

    // Stop works on a paused sandbox, and leaves no group (its freezer group included).
    let _ = pause_or_explain(&stack, &id, test).await.expect("pause");
    let stopped = tokio::time::timeout(Duration::from_secs(20), stop(&stack, &id, true))
        .await
        .expect("stop of a paused sandbox returns");
    assert_eq!(stopped["stopped"], true);
    assert!(
        eventually(Duration::from_secs(10), || async {
            cgroups_named(&group).is_empty()
        })
        .await,
        "the stopped sandbox left groups: {:?}",
        cgroups_named(&group)
    );
    let (code, _) = expect_err(
        stack.call("pause", json!({"sandbox_id": id})).await,
        "pause stopped",
    );
    assert_eq!(code, "S004");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exec_or_fs_call_resumes_a_paused_sandbox_and_max_paused_secs_stops_one() {
    let test = "an_exec_or_fs_call_resumes_a_paused_sandbox_and_max_paused_secs_stops_one";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::start(json!({"max_paused_secs": 3}), Default::default()).await;
    let id = create(&stack, "python", json!({"idle_timeout_secs": 600})).await;
    let group = cgroup_name(&stack, &id);
    exec_ok(&stack, &id, sh(BUSY_COUNTER)).await;
    if pause_or_explain(&stack, &id, test).await.is_none() {
        stop(&stack, &id, true).await;
        return;
    }
    // An exec on it resumes it first, and its programs run again.
    let answer = exec_ok(&stack, &id, sh("echo hello")).await;
    assert_eq!(stdout(&answer), "hello\n");
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(listed_paused(&list, &id), Some(false), "{list}");
    let (before, _) = sandbox_cpu_ticks(&group);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (after, _) = sandbox_cpu_ticks(&group);
    assert!(
        after > before + 5,
        "the counter runs again: {before} -> {after}"
    );

    // An fs call too.
    pause_or_explain(&stack, &id, test).await.expect("pause");
    let stat = stack
        .call("fs::stat", json!({"sandbox_id": id, "path": "/tmp/count"}))
        .await
        .expect("fs::stat on a paused sandbox");
    assert!(stat["size"].as_u64().is_some(), "{stat}");
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(listed_paused(&list, &id), Some(false), "{list}");

    // Paused past max_paused_secs (3 s here): stopped, its groups gone.
    pause_or_explain(&stack, &id, test).await.expect("pause");
    let reaped = eventually(Duration::from_secs(20), || async {
        !live_ids(&stack).await.contains(&id)
    })
    .await;
    assert!(reaped, "a sandbox paused past max_paused_secs is stopped");
    let (code, body) = expect_err(exec(&stack, &id, sh("true")).await, "exec after");
    assert_eq!(code, "S004", "{body}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            cgroups_named(&group).is_empty()
        })
        .await,
        "the stopped sandbox left groups: {:?}",
        cgroups_named(&group)
    );
}

fn uuid_never_seen() -> String {
    "00000000-0000-4000-8000-000000000000".to_string()
}
