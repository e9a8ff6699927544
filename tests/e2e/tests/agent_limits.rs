//! The agent's own bounds on the bwrap plugin: every fs call ends (a FIFO, a device, a pipe
//! nobody drains) and leaves no agent thread behind, and the idle timeout still reaps the
//! sandbox afterwards; `fs::sed` works in bounded memory whatever its replacement; a memory
//! bomb beside an agent call kills the bomb, never the agent; and requests past the
//! documented ceilings (`idle_timeout_secs`, `env`, a `vm_id` that is the worker token) are
//! S001 while the adapter keeps serving.

mod sandbox_support;
mod worker_support;

use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{
    agent_pid, create, eventually, exec, exec_ok, expect_err, fs, fs_ok, listed_serving, live_ids,
    sh, status_kib, stdout, stop,
};
use serde_json::{json, Value};

/// How long a test waits for a call that must end (far past any agent deadline would be a
/// hang: the test client's own timeout is two minutes).
const ENDS_WITHIN: Duration = Duration::from_secs(90);

/// The agent's threads right now.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

/// `fs::<verb>` that must end (with any answer) within [`ENDS_WITHIN`].
async fn fs_ends(
    stack: &Stack,
    verb: &str,
    id: &str,
    fields: Value,
) -> Result<Value, e2e_tests::RemoteError> {
    let shown = format!("fs::{verb} {fields}");
    tokio::time::timeout(ENDS_WITHIN, fs(stack, verb, id, fields))
        .await
        .unwrap_or_else(|_| panic!("{shown} never ended\n{}", stack.adapter.log()))
}

#[tokio::test(flavor = "multi_thread")]
async fn fifos_and_devices_end_every_fs_call_and_the_idle_timeout_still_reaps() {
    if !bwrap_usable("fifos_and_devices_end_every_fs_call_and_the_idle_timeout_still_reaps") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({"idle_timeout_secs": 5})).await;
    let agent = agent_pid(&stack, &id);
    // A FIFO nobody writes, one a program holds open for reading and never drains, and the
    // program itself, in the background.
    let holder = "import os, time\n\
                  os.mkfifo('/tmp/held')\n\
                  fd = os.open('/tmp/held', os.O_RDONLY | os.O_NONBLOCK)\n\
                  open('/tmp/held.ready', 'w').close()\n\
                  time.sleep(1000)\n";
    let mut background = sh(
        "mkfifo /tmp/pipe && python3 -c \"$HOLDER\" >/dev/null 2>&1 & \
                             while [ ! -e /tmp/held.ready ]; do sleep 0.05; done; echo ready",
    );
    background["env"] = json!({ "HOLDER": holder });
    let ready = exec_ok(&stack, &id, background).await;
    assert_eq!(stdout(&ready), "ready\n", "{ready}");
    // The agent's deadline thread starts with its first fs call: counted before, too.
    fs_ok(&stack, "stat", &id, json!({"path": "/tmp/pipe"})).await;
    let before = threads(agent);

    // Reading a FIFO blocked in open for ever; a device never ends.
    for path in ["/tmp/pipe", "/tmp/held", "/dev/zero", "/dev/null"] {
        let (code, body) = expect_err(
            fs_ends(&stack, "read", &id, json!({ "path": path })).await,
            path,
        );
        assert_eq!(code, "S212", "fs::read {path}: {body}");
    }
    // Writing: a FIFO without a reader blocked in open, one whose reader never drains it
    // blocked once its buffer was full.
    let big = "x".repeat(1 << 20);
    for path in ["/tmp/pipe", "/tmp/held", "/dev/null"] {
        let (code, body) = expect_err(
            fs_ends(&stack, "write", &id, json!({"path": path, "content": big})).await,
            path,
        );
        assert_eq!(code, "S212", "fs::write {path}: {body}");
    }
    // Searching and editing: a FIFO is not a file to search or rewrite.
    let (code, body) = expect_err(
        fs_ends(
            &stack,
            "grep",
            &id,
            json!({"path": "/tmp/pipe", "pattern": "x"}),
        )
        .await,
        "grep a fifo",
    );
    assert_eq!(code, "S212", "{body}");
    let edited = fs_ends(
        &stack,
        "sed",
        &id,
        json!({"files": ["/tmp/pipe", "/tmp/held"], "pattern": "x", "replacement": "y"}),
    )
    .await
    .expect("sed answers per file");
    let rows = edited["results"].as_array().expect("results");
    assert!(rows.iter().all(|r| r["success"] == false), "{edited}");

    // No agent thread is left behind by the calls.
    let settled = eventually(Duration::from_secs(10), || async {
        threads(agent) <= before
    })
    .await;
    assert!(
        settled,
        "agent threads: {} before the calls, {} after",
        before,
        threads(agent)
    );
    // The sandbox still serves, and, idle again, it is reaped.
    let echo = exec_ok(&stack, &id, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(stdout(&echo), "ok\n");
    let reaped = eventually(Duration::from_secs(30), || async {
        !live_ids(&stack).await.contains(&id)
    })
    .await;
    assert!(reaped, "an idle sandbox is reaped after its fs calls ended");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_survives_an_fs_sed_bomb_in_bounded_memory() {
    if !bwrap_usable("the_agent_survives_an_fs_sed_bomb_in_bounded_memory") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let agent = agent_pid(&stack, &id);
    // Four files of 64 KiB, each byte a match.
    exec_ok(
        &stack,
        &id,
        sh("mkdir -p /tmp/bomb && for i in 0 1 2 3; do \
            head -c 65536 /dev/zero | tr '\\0' a > /tmp/bomb/f$i.txt; done"),
    )
    .await;
    // A 900 KiB replacement (what fits one request frame): every match would add as much.
    let huge = "b".repeat(900 * 1024);
    let result = fs_ends(
        &stack,
        "sed",
        &id,
        json!({"path": "/tmp/bomb", "pattern": "a", "replacement": huge}),
    )
    .await;
    let (code, body) = expect_err(result, "a 900 KiB replacement");
    assert_eq!(code, "S210", "{body}");
    // A replacement at the documented maximum (64 KiB): each file's result would be 4 GiB.
    let most = "b".repeat(64 * 1024);
    let edited = fs_ends(
        &stack,
        "sed",
        &id,
        json!({"path": "/tmp/bomb", "pattern": "a", "replacement": most, "regex": false}),
    )
    .await
    .unwrap_or_else(|e| panic!("sed bomb: {e:?}\n{}", stack.adapter.log()));
    let rows = edited["results"].as_array().expect("results");
    assert_eq!(rows.len(), 4, "{edited}");
    for row in rows {
        assert_eq!(row["success"], false, "{row}");
        assert!(
            row["error"].as_str().is_some_and(|e| e.contains("MiB")),
            "{row}"
        );
    }
    // The files are untouched, no temporary is left, and the agent stayed small.
    let check = exec_ok(
        &stack,
        &id,
        sh("cat /tmp/bomb/*.txt | tr -d a | wc -c; ls -A /tmp/bomb | wc -l"),
    )
    .await;
    assert_eq!(stdout(&check), "0\n4\n", "{check}");
    let peak_kib = status_kib(agent, "VmHWM").expect("the agent's VmHWM");
    println!("agent VmHWM after the sed bomb: {peak_kib} KiB");
    assert!(
        peak_kib < 96 * 1024,
        "the agent's peak memory is {peak_kib} KiB"
    );
    // Searches at once over files of 12 MiB, each searched as one buffer when the agent's
    // budget has room, else line by line: the agent's peak stays bounded all the same.
    exec_ok(
        &stack,
        &id,
        sh("mkdir -p /tmp/big && for i in 1 2 3 4 5 6 7 8; do \
            head -c 12582912 /dev/zero | tr '\\0' 'g' | fold -w 200 > /tmp/big/$i.txt; done"),
    )
    .await;
    let grep = || {
        fs_ends(
            &stack,
            "grep",
            &id,
            json!({"path": "/tmp/big", "pattern": "x$", "max_matches": 10}),
        )
    };
    let answers = futures::future::join_all((0..6).map(|_| grep())).await;
    for answer in answers {
        let answer = answer.unwrap_or_else(|e| panic!("grep: {e:?}"));
        assert_eq!(answer["matches"], json!([]), "{answer}");
    }
    let peak_kib = status_kib(agent, "VmHWM").expect("the agent's VmHWM");
    println!("agent VmHWM after 6 greps at once over 96 MiB: {peak_kib} KiB");
    assert!(
        // The budget of large buffers (64 MiB) and room for the rest: 126 MiB here before
        // the allocator gave freed buffers back.
        peak_kib < 96 * 1024,
        "the agent's peak memory is {peak_kib} KiB"
    );
    let (serving, list) = listed_serving(&stack, &id).await;
    assert!(serving, "{list}");
    // A normal edit still works.
    exec_ok(&stack, &id, sh("echo 'hello old world' > /tmp/one.txt")).await;
    let edited = fs_ok(
        &stack,
        "sed",
        &id,
        json!({"files": ["/tmp/one.txt"], "pattern": "old", "replacement": "new"}),
    )
    .await;
    assert_eq!(edited["total_replacements"], 1, "{edited}");
    stop(&stack, &id, true).await;
}

/// The limits the bwrap backend can enforce on this host (`cpus`, `memory`, `pids`).
async fn memory_enforced(stack: &Stack, test: &str) -> bool {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let in_force = &info["backend"]["isolation"]["limits_in_force"];
    if in_force
        .as_array()
        .is_some_and(|all| all.iter().any(|l| l == "memory"))
    {
        return true;
    }
    println!(
        "\n*** {test} DID NOT RUN: the memory limit is not in force on this host (limits_in_force: {in_force}) ***\n"
    );
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_beside_an_agent_call_kills_the_bomb_not_the_agent() {
    let test = "a_memory_bomb_beside_an_agent_call_kills_the_bomb_not_the_agent";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::bwrap().await;
    if !memory_enforced(&stack, test).await {
        return;
    }
    let id = create(&stack, "python", json!({"memory_mb": 128})).await;
    let agent = agent_pid(&stack, &id);
    // The agent's score never invites the OOM killer more than a guest program's does.
    let score = |pid: u32| -> i32 {
        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .expect("oom_score_adj")
    };
    // Files for a grep that makes the agent work while the bomb grows: 32 of 1 MiB.
    exec_ok(
        &stack,
        &id,
        sh("mkdir -p /tmp/hay && for i in $(seq 32); do \
            head -c 1048576 /dev/zero | tr '\\0' 'h' | fold -w 100 > /tmp/hay/$i.txt; done"),
    )
    .await;
    let bomb = "chunks = []\nfor _ in range(64):\n    chunks.append(b'\\x01' * (16 << 20))\nprint('survived')";
    let bombed = exec(
        &stack,
        &id,
        json!({"argv": ["python3", "-c", bomb], "timeout_ms": 60_000}),
    );
    let searches = async {
        let mut answers = Vec::new();
        for _ in 0..5 {
            answers.push(
                fs_ends(
                    &stack,
                    "grep",
                    &id,
                    json!({"path": "/tmp/hay", "pattern": "x", "max_matches": 10}),
                )
                .await,
            );
        }
        answers
    };
    let (bombed, answers) = tokio::join!(bombed, searches);
    let bombed = bombed.unwrap_or_else(|e| panic!("bomb exec: {e:?}\n{}", stack.adapter.log()));
    assert_eq!(bombed["exit_code"], 137, "the bomb is the victim: {bombed}");
    for answer in answers {
        let answer = answer.unwrap_or_else(|e| panic!("grep beside the bomb: {e:?}"));
        assert_eq!(answer["matches"], json!([]), "{answer}");
    }
    // The agent is the same process, alive, and answers.
    assert_eq!(agent_pid(&stack, &id), agent, "the agent was replaced");
    let guest = exec_ok(&stack, &id, sh("cat /proc/self/oom_score_adj")).await;
    let guest_score: i32 = stdout(&guest).trim().parse().expect("guest score");
    println!(
        "oom_score_adj: agent {}, guest program {guest_score}; agent VmHWM {:?} KiB",
        score(agent),
        status_kib(agent, "VmHWM")
    );
    assert!(
        score(agent) < guest_score,
        "agent {} vs guest {guest_score}",
        score(agent)
    );
    let (serving, list) = listed_serving(&stack, &id).await;
    assert!(serving, "{list}");
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_past_the_ceilings_are_s001_and_the_adapter_keeps_serving() {
    if !bwrap_usable("requests_past_the_ceilings_are_s001_and_the_adapter_keeps_serving") {
        return;
    }
    let stack = Stack::bwrap().await;
    let long_name = "N".repeat(100_000);
    let long_value = "v".repeat(129 * 1024);
    let many: Vec<String> = (0..5000).map(|i| format!("V{i}=1")).collect();
    let create_cases = [
        (json!({"idle_timeout_secs": 1u64 << 63}), "idle 2^63"),
        (
            json!({"idle_timeout_secs": 604_801}),
            "idle a week and a second",
        ),
        (
            json!({"env": {long_name.clone(): "1"}}),
            "env name 100,000 bytes",
        ),
        (json!({"env": [format!("{long_name}=1")]}), "env list name"),
        (
            json!({"env": {"BIG": long_value.clone()}}),
            "env value 129 KiB",
        ),
        (json!({ "env": many }), "5000 variables"),
    ];
    for (extra, what) in create_cases {
        let mut payload = json!({"image": "python"});
        payload
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (code, body) = expect_err(stack.call("create", payload).await, what);
        assert_eq!(code, "S001", "{what}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.len() < 1000, "{what}: the message echoes the input");
    }
    // At the ceiling: a week.
    let id = create(&stack, "python", json!({"idle_timeout_secs": 604_800})).await;
    for (env, what) in [
        (json!({long_name.clone(): "1"}), "exec env name"),
        (json!({"BIG": long_value}), "exec env value"),
    ] {
        let (code, body) = expect_err(
            exec(&stack, &id, json!({"argv": ["true"], "env": env})).await,
            what,
        );
        assert_eq!(code, "S001", "{what}: {body}");
    }
    let run = stack
        .call(
            "run",
            json!({"image": "python", "lang": "sh", "code": "true", "env": {long_name: "1"}}),
        )
        .await;
    assert_eq!(expect_err(run, "run env name").0, "S001");
    // Still serving, and the sandbox is untouched.
    let echo = exec_ok(
        &stack,
        &id,
        json!({"argv": ["echo", "ok"], "env": {"A": "1"}}),
    )
    .await;
    assert_eq!(stdout(&echo), "ok\n");
    assert!(live_ids(&stack).await.contains(&id));
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_id_that_is_the_token_is_refused_and_never_printed() {
    if !bwrap_usable("a_vm_id_that_is_the_token_is_refused_and_never_printed") {
        return;
    }
    let dir = e2e_tests::host_dir();
    let stack = Stack::start(json!({}), worker_support::compose_options(dir.path())).await;
    let token = worker_support::TOKEN;
    for op in ["prepare", "start", "status", "logs", "stop", "destroy"] {
        let payload = json!({
            "vm_id": token,
            "image": "python",
            "host_path": dir.path(),
            "command": ["/bin/true"],
        });
        let (code, message) = worker_support::worker_err(&stack, op, payload).await;
        assert_eq!(code, "S001", "worker::{op}: {message}");
        assert!(!message.contains(token), "worker::{op} echoed the token");
    }
    // Over 64 bytes is not an identifier either.
    let long = "w".repeat(65);
    let (code, _) = worker_support::worker_err(
        &stack,
        "prepare",
        json!({"vm_id": long, "image": "python", "host_path": dir.path()}),
    )
    .await;
    assert_eq!(code, "S001");
    assert!(
        !stack.adapter.log().contains(token),
        "the adapter logged the token"
    );
    let leaks: Vec<_> = walk_files(stack.state_dir.path())
        .into_iter()
        .filter(|f| {
            std::fs::read(f)
                .is_ok_and(|bytes| bytes.windows(token.len()).any(|w| w == token.as_bytes()))
        })
        .collect();
    assert!(leaks.is_empty(), "files holding the token: {leaks:?}");
    // Still serving.
    worker_support::worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": "fine", "image": "python", "host_path": dir.path()}),
    )
    .await;
}

/// Every file under `dir`, links not followed.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            found.extend(walk_files(&entry.path()));
        } else if kind.is_file() {
            found.push(entry.path());
        }
    }
    found
}
