//! Background processes through the engine on the bwrap plugin: `exec {background: true}`
//! answers at once with a `process_id`; `process::list`, `process::output` (paged, and
//! followed live into a channel), `process::kill` and `process::wait` act on it; a flood
//! keeps the agent's and the adapter's memory bounded; the per-sandbox ceiling and bad input
//! are S-codes; background processes end with their sandbox, and keep it from its idle
//! timeout only with `background_keeps_alive`.

mod sandbox_support;

use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e_tests::{bwrap_usable, AdapterOptions, Stack};
use iii_sdk::channel::ChannelReader;
use sandbox_support::streams::{channel, channel_ref};
use sandbox_support::{
    agent_pid, create, descendants, exec_ok, expect_err, recorded_process, status_kib,
};
use serde_json::{json, Value};

/// `yes flood`, as fast as Python writes (the image has no `yes`).
const FLOOD: &str = "import os\nb = b'flood\\n' * 8192\nwhile True:\n    os.write(1, b)";

const TICKER: &str = "i=0; while :; do echo tick $i; i=$((i+1)); sleep 1; done";

async fn start(stack: &Stack, id: &str, argv: Value) -> Value {
    let payload = json!({"sandbox_id": id, "argv": argv, "background": true});
    stack
        .call("exec", payload)
        .await
        .unwrap_or_else(|e| panic!("background exec: {e:?}\n{}", stack.adapter.log()))
}

async fn process(stack: &Stack, verb: &str, id: &str, fields: Value) -> Value {
    let mut payload = json!({"sandbox_id": id});
    if let (Some(base), Value::Object(fields)) = (payload.as_object_mut(), fields) {
        base.extend(fields);
    }
    stack
        .call(&format!("process::{verb}"), payload)
        .await
        .unwrap_or_else(|e| panic!("process::{verb}: {e:?}\n{}", stack.adapter.log()))
}

/// Host processes named `comm` in bwrap sandbox `id` (its bwrap gone: none).
fn in_sandbox(stack: &Stack, id: &str, comm: &str) -> usize {
    let root = stack
        .state_dir
        .path()
        .join("sandboxes")
        .join(id)
        .join("process");
    if !root.exists() {
        return 0;
    }
    descendants(recorded_process(stack, id))
        .iter()
        .filter(|p| p.comm == comm)
        .count()
}

/// A ticker: listed as running, its lines paged with `since`, followed live in a channel,
/// killed (the follower's exit line and `process::wait` say 143).
#[tokio::test(flavor = "multi_thread")]
async fn a_ticker_is_listed_paged_followed_killed_and_waited_for() {
    if !bwrap_usable("a_ticker_is_listed_paged_followed_killed_and_waited_for") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let asked = Instant::now();
    let started = start(&stack, &id, json!(["/bin/sh", "-c", TICKER])).await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let pid = started["process_id"].as_u64().expect("process_id");
    assert!(started["pid"].as_i64().unwrap_or(0) > 1, "{started}");
    assert_eq!(started["running"], true, "{started}");

    // It holds no exec slot: the sandbox's execs go on meanwhile.
    let listed = stack.call("list", json!({})).await.expect("list");
    let mine = listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sandbox_id"] == id.as_str())
        .cloned()
        .expect("listed");
    assert_eq!(mine["exec_in_flight"], 0, "{mine}");

    let processes = process(&stack, "list", &id, json!({})).await;
    let entry = &processes["processes"][0];
    assert_eq!(entry["process_id"], pid, "{processes}");
    assert_eq!(entry["running"], true, "{processes}");
    assert_eq!(entry["exit_code"], Value::Null, "{processes}");
    assert_eq!(
        entry["argv"],
        json!(["/bin/sh", "-c", TICKER]),
        "{processes}"
    );
    assert!(entry["started_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));

    tokio::time::sleep(Duration::from_millis(2500)).await;
    let first = process(&stack, "output", &id, json!({"process_id": pid})).await;
    let text = first["output"].as_str().unwrap();
    assert!(text.starts_with("tick 0\ntick 1\n"), "{first}");
    assert_eq!(first["truncated"], false, "{first}");
    assert_eq!(first["start"], 0, "{first}");
    let next = first["next"].as_u64().unwrap();
    assert_eq!(next, text.len() as u64, "{first}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let later = process(
        &stack,
        "output",
        &id,
        json!({"process_id": pid, "since": next}),
    )
    .await;
    let more = later["output"].as_str().unwrap();
    assert!(
        more.starts_with("tick ") && !more.contains("tick 0\n"),
        "{later}"
    );
    assert_eq!(later["start"], next, "{later}");

    // Followed live: the follow answers at once, lines come as the ticker prints them.
    let (write_end, read_end) = channel(&stack).await;
    let followed = process(
        &stack,
        "output",
        &id,
        json!({"process_id": pid, "since": later["next"], "stream": write_end}),
    )
    .await;
    assert_eq!(followed["following"], true, "{followed}");
    let reader = ChannelReader::new(&stack.engine.url(), &channel_ref(&read_end));
    let mut pending = Vec::new();
    let mut lines: Vec<Value> = Vec::new();
    let mut ticks = 0;
    while ticks < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(10), reader.next_binary())
            .await
            .expect("a line within 10 s")
            .expect("reads")
            .expect("not the end yet");
        pending.extend(frame);
        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            let value: Value = serde_json::from_slice(&line).expect("JSON line");
            if let Some(data) = value["data_b64"].as_str() {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .expect("base64");
                ticks += String::from_utf8_lossy(&bytes).matches("tick ").count();
            }
            lines.push(value);
        }
    }

    let killed = process(&stack, "kill", &id, json!({"process_id": pid})).await;
    assert_eq!(killed["process_id"], pid, "{killed}");
    let waited = process(
        &stack,
        "wait",
        &id,
        json!({"process_id": pid, "timeout_ms": 10_000}),
    )
    .await;
    assert_eq!(waited["running"], false, "{waited}");
    assert_eq!(waited["exit_code"], 128 + 15, "{waited}");
    assert_eq!(waited["timed_out"], false, "{waited}");
    // The follower ends with the exit line, then the channel's end.
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(10), reader.next_binary())
        .await
        .expect("the follow ends")
        .expect("reads")
    {
        pending.extend(frame);
    }
    for line in pending.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        lines.push(serde_json::from_slice(line).expect("JSON line"));
    }
    let exit = lines.last().expect("lines");
    assert_eq!(exit["exit"]["exit_code"], 128 + 15, "{exit}");
    assert_eq!(in_sandbox(&stack, &id, "sh"), 0, "the ticker is left");
    let listed = process(&stack, "list", &id, json!({})).await;
    assert_eq!(listed["processes"][0]["running"], false, "{listed}");
    assert_eq!(listed["processes"][0]["exit_code"], 143, "{listed}");
}

/// A `yes`-like flood for a few seconds: the output keeps its last 1 MiB (`truncated`), and neither the
/// agent's nor the adapter's memory grows with what it wrote.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_is_truncated_in_bounded_memory() {
    if !bwrap_usable("a_flood_is_truncated_in_bounded_memory") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let agent = agent_pid(&stack, &id);
    let adapter = stack.adapter.pid();
    let rss = |pid: u32| status_kib(pid, "VmRSS").expect("VmRSS");
    let (agent_before, adapter_before) = (rss(agent), rss(adapter));
    let mut floods = Vec::new();
    for _ in 0..3 {
        let started = start(&stack, &id, json!(["python3", "-c", FLOOD])).await;
        floods.push(started["process_id"].as_u64().unwrap());
    }
    let (mut agent_peak, mut adapter_peak) = (0, 0);
    let mut total = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Paging it through the adapter while it floods.
        let page = process(&stack, "output", &id, json!({"process_id": floods[0]})).await;
        total = page["total_bytes"].as_u64().unwrap();
        agent_peak = agent_peak.max(rss(agent));
        adapter_peak = adapter_peak.max(rss(adapter));
    }
    let page = process(&stack, "output", &id, json!({"process_id": floods[0]})).await;
    let text = page["output"].as_str().unwrap();
    assert_eq!(page["truncated"], true, "{}", &text[..text.len().min(80)]);
    assert!(page["start"].as_u64().unwrap() > 0);
    assert!(text.len() <= 1024 * 1024, "{}", text.len());
    assert!(
        text.len() >= 512 * 1024,
        "the ring keeps its last MiB: {}",
        text.len()
    );
    assert!(text.ends_with("flood\n") || text.ends_with("floo") || !text.is_empty());
    println!(
        "3 floods for 3 s ({} MiB written by the first): agent VmRSS {} -> peak {} KiB, \
         adapter VmRSS {} -> peak {} KiB",
        total / (1024 * 1024),
        agent_before,
        agent_peak,
        adapter_before,
        adapter_peak
    );
    assert!(total > 16 * 1024 * 1024, "the flood wrote {total} bytes");
    // Rings: 4 MiB in all; read buffers and threads: a few MiB more.
    assert!(
        agent_peak < agent_before + 16 * 1024,
        "agent {agent_before} -> {agent_peak} KiB"
    );
    assert!(
        adapter_peak < adapter_before + 48 * 1024,
        "adapter {adapter_before} -> {adapter_peak} KiB"
    );
    for flood in floods {
        process(
            &stack,
            "kill",
            &id,
            json!({"process_id": flood, "signal": "KILL"}),
        )
        .await;
        let waited = process(&stack, "wait", &id, json!({"process_id": flood})).await;
        assert_eq!(waited["exit_code"], 128 + 9, "{waited}");
    }
}

/// The 33rd running process is S400; unknown ids, bad signals and bad requests are S001;
/// the adapter keeps serving; stopping the sandbox ends its background processes.
#[tokio::test(flavor = "multi_thread")]
async fn the_ceiling_and_bad_input_are_s_codes_and_stop_ends_them() {
    if !bwrap_usable("the_ceiling_and_bad_input_are_s_codes_and_stop_ends_them") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    for _ in 0..32 {
        start(&stack, &id, json!(["sleep", "300"])).await;
    }
    let one_more = json!({"sandbox_id": id, "argv": ["sleep", "300"], "background": true});
    let (code, body) = expect_err(stack.call("exec", one_more).await, "a 33rd process");
    assert_eq!(code, "S400", "{body}");
    assert_eq!(body["retryable"], true, "{body}");
    assert_eq!(in_sandbox(&stack, &id, "sleep"), 32);

    let unknown = "00000000-0000-4000-8000-000000000000";
    let cases = [
        (
            "output",
            json!({"sandbox_id": id, "process_id": 999}),
            "S001",
        ),
        ("kill", json!({"sandbox_id": id, "process_id": 999}), "S001"),
        ("wait", json!({"sandbox_id": id, "process_id": 999}), "S001"),
        (
            "kill",
            json!({"sandbox_id": id, "process_id": 1, "signal": "USR1"}),
            "S001",
        ),
        (
            "kill",
            json!({"sandbox_id": id, "process_id": 1, "signal": 19}),
            "S001",
        ),
        ("output", json!({"sandbox_id": id}), "S001"),
        (
            "output",
            json!({"sandbox_id": id, "process_id": -1}),
            "S001",
        ),
        (
            "wait",
            json!({"sandbox_id": id, "process_id": 1, "timeout_ms": 0}),
            "S001",
        ),
        (
            "output",
            json!({"sandbox_id": id, "process_id": 1, "stream": "c"}),
            "S001",
        ),
        ("list", json!({"sandbox_id": unknown}), "S002"),
    ];
    for (verb, payload, want) in cases {
        let (code, body) = expect_err(
            stack
                .call(&format!("process::{verb}"), payload.clone())
                .await,
            &format!("process::{verb} {payload}"),
        );
        assert_eq!(code, want, "process::{verb} {payload}: {body}");
    }
    let with_stdin =
        json!({"sandbox_id": id, "argv": ["cat"], "background": true, "stdin": "aGk="});
    let (code, _) = expect_err(stack.call("exec", with_stdin).await, "background stdin");
    assert_eq!(code, "S001");
    let echo = exec_ok(&stack, &id, json!({"argv": ["echo", "still"]})).await;
    assert_eq!(echo["stdout"], "still\n", "{echo}");

    // Killing one makes room for one: a program that cannot run is a process that ended
    // with 127 at once, its message in its output.
    process(&stack, "kill", &id, json!({"process_id": 1, "signal": 9})).await;
    process(&stack, "wait", &id, json!({"process_id": 1})).await;
    let again = start(&stack, &id, json!(["no-such-program"])).await;
    assert_eq!(again["running"], false, "{again}");
    assert_eq!(again["exit_code"], 127, "{again}");
    let missing_output = process(
        &stack,
        "output",
        &id,
        json!({"process_id": again["process_id"]}),
    )
    .await;
    assert!(
        missing_output["output"]
            .as_str()
            .unwrap()
            .contains("command not found"),
        "{missing_output}"
    );

    let bwrap = recorded_process(&stack, &id);
    stack
        .call("stop", json!({"sandbox_id": id, "wait": true}))
        .await
        .expect("stop");
    let left: Vec<_> = descendants(bwrap)
        .into_iter()
        .filter(|p| p.comm == "sleep")
        .collect();
    assert!(left.is_empty(), "sleeps left after stop: {left:?}");
}

/// Without `background_keeps_alive` a sandbox whose only activity is a background process
/// reaches its idle timeout (and the process ends with it); with it, the sandbox stays.
#[tokio::test(flavor = "multi_thread")]
async fn only_background_keeps_alive_keeps_an_idle_sandbox() {
    if !bwrap_usable("only_background_keeps_alive_keeps_an_idle_sandbox") {
        return;
    }
    for keeps_alive in [false, true] {
        let config = json!({"background_keeps_alive": keeps_alive});
        let stack = Stack::start(config, AdapterOptions::default()).await;
        let id = create(&stack, "python", json!({"idle_timeout_secs": 2})).await;
        start(&stack, &id, json!(["sleep", "300"])).await;
        let bwrap = recorded_process(&stack, &id);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let listed = stack.call("list", json!({})).await.expect("list");
        let live = listed["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["sandbox_id"] == id.as_str() && s["stopped"] == false);
        assert_eq!(
            live, keeps_alive,
            "background_keeps_alive {keeps_alive}: {listed}"
        );
        let sleeps = descendants(bwrap)
            .iter()
            .filter(|p| p.comm == "sleep")
            .count();
        assert_eq!(
            sleeps,
            usize::from(keeps_alive),
            "keeps_alive {keeps_alive}"
        );
    }
}
