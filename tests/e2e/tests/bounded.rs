//! Bounded and self-healing sandboxes on the bwrap plugin: a fork bomb is capped
//! by `max_pids_per_sandbox`, creates above the adapter's ceilings are S400 without any
//! `per_image_caps`, a memory bomb kills its own process and not the agent, a sandbox whose
//! agent is gone is stopped at once, oversized requests are S001 and leave the link whole,
//! and bytes a program writes into the agent's own descriptors cannot break the link.
//!
//! The limits need a writable cgroup hierarchy (root adapter): where
//! `adapter::info.backend.isolation.limits_in_force` lacks one, its test prints DID NOT RUN.

mod sandbox_support;

use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{
    agent_pid, create, exec, exec_ok, expect_err, listed_serving, sh, stdout, stop,
};
use serde_json::json;

/// The limits the bwrap backend can enforce on this host (`cpus`, `memory`, `pids`).
async fn limits_in_force(stack: &Stack) -> Vec<String> {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    info["backend"]["isolation"]["limits_in_force"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|l| l.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// True when `limit` is enforced here; else prints why `test` did not run.
async fn enforced(stack: &Stack, limit: &str, test: &str) -> bool {
    let in_force = limits_in_force(stack).await;
    if !in_force.iter().any(|l| l == limit) {
        println!(
            "\n*** {test} DID NOT RUN: the {limit} limit is not in force on this host (limits_in_force: {in_force:?}; an ordinary-user adapter has no writable cgroup) ***\n"
        );
        return false;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_is_capped_and_the_sandbox_then_runs_echo() {
    let test = "a_fork_bomb_is_capped_and_the_sandbox_then_runs_echo";
    if !bwrap_usable(test) {
        return;
    }
    const PIDS: u64 = 128;
    let stack = Stack::start(json!({"max_pids_per_sandbox": PIDS}), Default::default()).await;
    if !enforced(&stack, "pids", test).await {
        return;
    }
    let id = create(&stack, "python", json!({})).await;
    // The limit is the sandbox's cgroup's (v1 `pids` hierarchy here, or v2).
    let group = sandbox_support::cgroup_name(&stack, &id);
    let pids_dirs = sandbox_support::pids_groups(&group);
    assert_eq!(pids_dirs.len(), 1, "one pids group for {group}");
    let limit = std::fs::read_to_string(pids_dirs[0].join("pids.max")).unwrap();
    assert_eq!(limit.trim(), PIDS.to_string());

    // Forks until the kernel refuses, counts the sandbox's processes from inside, then ends
    // its children.
    let counter = r#"
import os, signal, time
children = []
try:
    while len(children) < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError as e:
    print("refused", e.errno)
print("forked", len(children))
print("processes", sum(1 for d in os.listdir("/proc") if d.isdigit()))
for pid in children:
    os.kill(pid, signal.SIGKILL)
"#;
    let result = exec_ok(
        &stack,
        &id,
        json!({"argv": ["python3", "-c", counter], "timeout_ms": 60_000}),
    )
    .await;
    let out = stdout(&result).to_string();
    println!("fork counter in a sandbox with pids.max {PIDS}: {out}");
    let number = |key: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key:?} in {out:?}"))
    };
    assert!(out.contains("refused 11"), "fork got EAGAIN: {out}");
    assert!(
        number("forked ") < PIDS && number("processes ") <= PIDS,
        "at most {PIDS} processes: {out}"
    );

    // A real fork bomb, ended by its timeout; the sandbox serves again afterwards.
    let mut bomb = sh("b() { b | b & }; b; sleep 30");
    bomb["timeout_ms"] = json!(3_000);
    let answer = exec(&stack, &id, bomb).await;
    if let Err(e) = &answer {
        assert_eq!(e.code, "S200", "the bomb times out: {e:?}");
    }
    let serves = sandbox_support::eventually(Duration::from_secs(30), || async {
        exec(&stack, &id, json!({"argv": ["echo", "ok"]}))
            .await
            .is_ok_and(|r| r["stdout"] == "ok\n")
    })
    .await;
    assert!(serves, "the sandbox runs `echo ok` after the fork bomb");
    stop(&stack, &id, true).await;
    assert!(
        !pids_dirs[0].exists(),
        "the pids group goes with the sandbox"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ceilings_hold_without_per_image_caps() {
    if !bwrap_usable("ceilings_hold_without_per_image_caps") {
        return;
    }
    let stack = Stack::bwrap().await;
    for (extra, what) in [
        (
            json!({"memory_mb": 4294967, "cpus": 100000}),
            "both far above",
        ),
        (json!({"cpus": 100000}), "cpus above the host's cores"),
        (json!({"memory_mb": 4294967}), "memory above the host's"),
    ] {
        let mut payload = json!({"image": "python"});
        payload
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (code, body) = expect_err(stack.call("create", payload).await, what);
        assert_eq!(code, "S400", "{what}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("max_"), "{what}: names the key: {body}");
    }
    // `run` creates too, with the same ceilings (through worker VMs as well: same check).
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(
        list["in_flight"], 0,
        "no slot kept by a refused create: {list}"
    );

    // Configured ceilings: at them fine, above them S400.
    let stack = Stack::start(
        json!({"max_cpus": 2, "max_memory_mb": 600}),
        Default::default(),
    )
    .await;
    let (code, body) = expect_err(
        stack
            .call("create", json!({"image": "python", "cpus": 3}))
            .await,
        "cpus above max_cpus",
    );
    assert_eq!(code, "S400", "{body}");
    let (code, body) = expect_err(
        stack
            .call("create", json!({"image": "python", "memory_mb": 601}))
            .await,
        "memory above max_memory_mb",
    );
    assert_eq!(code, "S400", "{body}");
    let id = create(&stack, "python", json!({"cpus": 2, "memory_mb": 600})).await;
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_dies_and_the_sandbox_keeps_serving() {
    let test = "a_memory_bomb_dies_and_the_sandbox_keeps_serving";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::bwrap().await;
    if !enforced(&stack, "memory", test).await {
        return;
    }
    let id = create(&stack, "python", json!({"memory_mb": 128})).await;
    // Touches every page (a zeroed buffer would not), 16 MiB at a time, far past 128 MiB.
    let bomb = "chunks = []\nfor _ in range(64):\n    chunks.append(b'\\x01' * (16 << 20))\nprint('survived')";
    let result = exec_ok(
        &stack,
        &id,
        json!({"argv": ["python3", "-c", bomb], "timeout_ms": 60_000}),
    )
    .await;
    assert_eq!(
        result["exit_code"], 137,
        "the bomb, not the agent, is the OOM killer's victim: {result}"
    );
    assert_ne!(stdout(&result), "survived\n", "{result}");
    // The same again from a shell's child: the program's descendants are the victims too.
    let mut nested = sh("python3 -c \"$BOMB\"; echo shell-left");
    nested["env"] = json!({ "BOMB": bomb });
    nested["timeout_ms"] = json!(60_000);
    let nested = exec_ok(&stack, &id, nested).await;
    assert_eq!(
        stdout(&nested),
        "shell-left\n",
        "only the python child died: {nested}"
    );
    let after = exec_ok(&stack, &id, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(
        after["stdout"], "ok\n",
        "the sandbox keeps serving: {after}"
    );
    let (serving, list) = listed_serving(&stack, &id).await;
    assert!(serving, "{list}");
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_whose_agent_is_killed_is_stopped_at_once() {
    if !bwrap_usable("a_sandbox_whose_agent_is_killed_is_stopped_at_once") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({"name": "doomed"})).await;
    let other = create(&stack, "python", json!({})).await;
    let layer = stack.state_dir.path().join("sandboxes").join(&id);
    let before = stack.call("list", json!({})).await.expect("list");
    assert_eq!(before["in_flight"], 2, "{before}");

    let pid = agent_pid(&stack, &id);
    let killed_at = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the agent from the host");
    let deadline = killed_at + Duration::from_secs(3);
    let (stopped, seen) = loop {
        let list = stack.call("list", json!({})).await.expect("list");
        let entry = list["sandboxes"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["sandbox_id"] == id.as_str()).cloned());
        let done = entry.as_ref().is_some_and(|e| e["stopped"] == true) && list["in_flight"] == 1;
        if done || std::time::Instant::now() > deadline {
            break (done, list);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "killed agent seen stopped in list after {} ms: {seen}",
        killed_at.elapsed().as_millis()
    );
    assert!(
        stopped,
        "list shows it stopped and its slot free within 3 s: {seen}"
    );
    let entry = seen["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sandbox_id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(entry["name"], "doomed", "{entry}");
    let cause = entry["cause"].as_str().unwrap_or_default();
    assert!(cause.contains("killed by signal 9"), "{entry}");

    let (code, body) = expect_err(
        exec(&stack, &id, json!({"argv": ["echo", "hi"]})).await,
        "exec on the dead sandbox",
    );
    assert_eq!(code, "S004", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("killed by signal 9")),
        "S004 names the cause: {body}"
    );
    let removed =
        sandbox_support::eventually(Duration::from_secs(10), || async { !layer.exists() }).await;
    assert!(removed, "its layer is released");
    // The other sandbox is untouched; `stop` on the dead one is fine and takes it off `list`.
    let alive = exec_ok(&stack, &other, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(alive["stdout"], "ok\n");
    assert_eq!(stop(&stack, &id, true).await["stopped"], true);
    let list = stack.call("list", json!({})).await.expect("list");
    assert!(
        !list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["sandbox_id"] == id.as_str()),
        "{list}"
    );
    stop(&stack, &other, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_requests_are_s001_and_the_next_exec_works() {
    if !bwrap_usable("oversized_requests_are_s001_and_the_next_exec_works") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let big = "x".repeat(2 * 1024 * 1024);
    let cases = [
        (
            "exec",
            json!({"sandbox_id": id, "argv": ["echo", big]}),
            "argv",
        ),
        (
            "exec",
            json!({"sandbox_id": id, "argv": ["true"], "env": {"BIG": big}}),
            "env",
        ),
        (
            "fs::stat",
            json!({"sandbox_id": id, "path": format!("/{big}")}),
            "path",
        ),
    ];
    for (function, payload, what) in cases {
        let (code, body) = expect_err(stack.call(function, payload).await, what);
        assert_eq!(code, "S001", "{what}: {body}");
        assert!(
            body["message"]
                .as_str()
                // An env value meets its own ceiling (128 KiB) first.
                .is_some_and(|m| m.contains("limit of 1048576 bytes")
                    || (what == "env" && m.contains("over 128 KiB"))),
            "{what}: the limit is named: {body}"
        );
        let next = exec_ok(&stack, &id, json!({"argv": ["echo", "ok"]})).await;
        assert_eq!(next["stdout"], "ok\n", "after the {what}: {next}");
    }
    // Large data still fits where it is streamed: 2 MiB of stdin.
    use base64::Engine as _;
    let stdin = base64::engine::general_purpose::STANDARD.encode(big.as_bytes());
    let counted = exec_ok(&stack, &id, json!({"argv": ["wc", "-c"], "stdin": stdin})).await;
    assert_eq!(stdout(&counted).trim(), (2 * 1024 * 1024).to_string());
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_written_into_the_agents_descriptors_cannot_break_the_link() {
    if !bwrap_usable("bytes_written_into_the_agents_descriptors_cannot_break_the_link") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let poison = sh("for f in 0 1 2 3 4 5 6 7 8 9 10 11 12; do \
         printf 'garbage\\000\\377\\377\\377\\377 not a frame' > /proc/1/fd/$f; done; \
         echo tried");
    let tried = exec_ok(&stack, &id, poison).await;
    println!("writing into /proc/1/fd/*: {tried}");
    assert_eq!(stdout(&tried), "tried\n", "{tried}");
    assert!(
        tried["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("Permission denied")),
        "the agent's descriptors are out of reach: {tried}"
    );
    for _ in 0..5 {
        let next = exec_ok(&stack, &id, json!({"argv": ["echo", "ok"]})).await;
        assert_eq!(next["stdout"], "ok\n", "{next}");
    }
    let (serving, list) = listed_serving(&stack, &id).await;
    assert!(serving, "{list}");
    stop(&stack, &id, true).await;
}
