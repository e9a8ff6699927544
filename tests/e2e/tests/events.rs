//! Lifecycle events through the engine: subscribers bind a function to the trigger type
//! `sandbox-libkrun::event` (the official Python SDK's `register_trigger`, in
//! `event_subscriber.py`, or raw protocol messages) and receive one JSON event per change, in
//! order, without payloads; a bad config is refused with an S-code; a subscriber that does
//! not keep up delays no sandbox call and is dropped once its queue is full.

mod sandbox_support;
mod worker_support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use e2e_tests::{bwrap_usable, AdapterOptions, Stack, PREFIX};
use iii_test_engine::client::Client;
use sandbox_support::{create, eventually, exec_ok, sh, stop};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TRIGGER_TYPE: &str = "sandbox-libkrun::event";
/// The same events under iii's sandbox family (on by default, provider `libkrun`).
const FAMILY_TRIGGER_TYPE: &str = "sandbox::provider::libkrun::event";
/// Far above what any event should take; the latencies themselves are printed.
const ARRIVE_WITHIN: Duration = Duration::from_secs(20);

/// A Python subscriber process; killed when dropped.
struct Subscriber {
    child: Child,
    out: PathBuf,
}

impl Subscriber {
    /// Starts `event_subscriber.py` bound with `config`, each event taking `sleep_s` to handle.
    async fn start(
        stack: &Stack,
        sdk: &Path,
        dir: &Path,
        name: &str,
        config: Value,
        sleep_s: f64,
    ) -> Subscriber {
        let out = dir.join(format!("{name}.jsonl"));
        let script = e2e_tests::repo_root().join("tests/e2e/tests/event_subscriber.py");
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(stack.engine.url())
            .arg(TRIGGER_TYPE)
            .arg(&out)
            .arg(name)
            .arg(config.to_string())
            .arg(sleep_s.to_string())
            .env("PYTHONPATH", sdk)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
        assert!(
            matches!(&first, Ok(Ok(Some(line))) if line == "subscribed"),
            "event_subscriber.py {name} did not subscribe: {first:?}"
        );
        Subscriber { child, out }
    }

    /// Every event received so far, with the time it arrived (seconds since the epoch).
    fn events(&self) -> Vec<(f64, Value)> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|line| {
                (
                    line["received_at"].as_f64().unwrap_or_default(),
                    line["event"].clone(),
                )
            })
            .collect()
    }

    fn raw(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn subscribers(stack: &Stack) -> u64 {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    info["events"]["subscribers"]
        .as_u64()
        .expect("events.subscribers")
}

async fn wait_subscribers(stack: &Stack, n: u64) {
    let reached = eventually(ARRIVE_WITHIN, || async { subscribers(stack).await == n }).await;
    assert!(
        reached,
        "the adapter has {} event subscribers, not {n}\n{}",
        subscribers(stack).await,
        stack.adapter.log()
    );
}

fn python_sdk(test: &str) -> Option<PathBuf> {
    if !bwrap_usable(test) {
        return None;
    }
    match e2e_tests::python_sdk() {
        Ok(dir) => Some(dir),
        Err(why) => {
            println!("\n*** {test} DID NOT RUN: {why} ***\n");
            None
        }
    }
}

fn of_sandbox<'a>(events: &'a [(f64, Value)], id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["sandbox_id"] == id)
        .collect()
}

fn kinds(events: &[&Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Milliseconds from an event's `at` to its arrival at the subscriber.
fn latency_ms(received_at: f64, event: &Value) -> f64 {
    let at = event["at"].as_str().expect("at");
    received_at * 1000.0
        - epoch_ms(at).unwrap_or_else(|| panic!("`at` is not RFC 3339 UTC with ms: {at}")) as f64
}

/// Milliseconds since the epoch of `YYYY-MM-DDTHH:MM:SS.mmmZ`, the form events carry.
fn epoch_ms(at: &str) -> Option<i64> {
    let b = at.as_bytes();
    if b.len() != 24 || b[4] != b'-' || b[10] != b'T' || b[19] != b'.' || b[23] != b'Z' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| at.get(range)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms)
}

/// A text no event should ever contain by chance.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(&values, 0.5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_subscriber_sees_each_change_in_order_without_payloads() {
    let test = "a_python_subscriber_sees_each_change_in_order_without_payloads";
    let Some(sdk) = python_sdk(test) else {
        return;
    };
    let stack = Stack::start(json!({}), AdapterOptions::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let all = Subscriber::start(&stack, &sdk, dir.path(), "all", json!({}), 0.0).await;
    let stops = Subscriber::start(
        &stack,
        &sdk,
        dir.path(),
        "stops",
        json!({"kinds": ["stopped"]}),
        0.0,
    )
    .await;
    wait_subscribers(&stack, 2).await;

    let secret = format!("env-secret-{}", unique());
    let marker = format!("output-marker-{}", unique());
    let id = create(&stack, "python", json!({"env": {"CREATE_SECRET": secret}})).await;
    let ran = exec_ok(
        &stack,
        &id,
        json!({
            "argv": ["/bin/sh", "-c", format!("echo {marker}; echo \"$EXEC_SECRET\" >&2; exit 3")],
            "env": {"EXEC_SECRET": secret},
            "stdin": base64_of(&secret),
        }),
    )
    .await;
    assert_eq!(ran["exit_code"], 3, "{ran}");
    stop(&stack, &id, true).await;
    let reaped = create(&stack, "python", json!({"idle_timeout_secs": 1})).await;

    let arrived = eventually(ARRIVE_WITHIN, || async {
        let events = all.events();
        of_sandbox(&events, &id).len() >= 5
            && of_sandbox(&events, &reaped)
                .iter()
                .any(|e| e["kind"] == "stopped")
    })
    .await;
    let events = all.events();
    assert!(arrived, "events: {events:?}\n{}", stack.adapter.log());

    let life = of_sandbox(&events, &id);
    assert_eq!(
        kinds(&life),
        ["created", "ready", "exec_started", "exec_ended", "stopped"],
        "{life:?}"
    );
    assert_eq!(life[0]["image"], "python");
    assert_eq!(life[3]["exit_code"], 3);
    assert_eq!(life[3]["timed_out"], false);
    assert_eq!(life[3]["cancelled"], false);
    assert!(life[3]["duration_ms"].is_u64(), "{}", life[3]);
    assert_eq!(life[4]["reason"], "caller");
    let idle = of_sandbox(&events, &reaped);
    assert_eq!(kinds(&idle), ["created", "ready", "stopped"], "{idle:?}");
    assert_eq!(idle[2]["reason"], "idle");

    // Nothing of the payloads: not the env, stdin or output of the exec, not the create's env.
    let raw = all.raw() + &stops.raw();
    assert!(!raw.contains(&secret), "an event carries the secret: {raw}");
    assert!(
        !raw.contains(&marker),
        "an event carries exec output: {raw}"
    );

    // The filtered subscriber saw the two stops and nothing else.
    let stopped = eventually(ARRIVE_WITHIN, || async { stops.events().len() >= 2 }).await;
    let only_stops = stops.events();
    assert!(stopped, "{only_stops:?}");
    assert!(
        only_stops.iter().all(|(_, e)| e["kind"] == "stopped"),
        "{only_stops:?}"
    );
    assert_eq!(only_stops.len(), 2, "{only_stops:?}");

    let mut latencies: Vec<f64> = events.iter().map(|(at, e)| latency_ms(*at, e)).collect();
    latencies.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "bench events_latency_ms median={p50:.1} p99={p99:.1} max={:.1} n={}",
        latencies[latencies.len() - 1],
        latencies.len()
    );
    assert!(
        p50 < 100.0,
        "half the events took over 100 ms to arrive: {latencies:?}"
    );
    assert!(
        latencies.iter().all(|ms| *ms < 2_000.0),
        "an event took seconds to arrive: {latencies:?}"
    );
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The raw protocol: a bad config is refused with our S-code (forwarded by the engine), a
/// good one counts, under our trigger type and the family's, and a subscriber that
/// disconnects is forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configs_are_refused_and_a_gone_subscriber_is_forgotten() {
    let test = "bad_configs_are_refused_and_a_gone_subscriber_is_forgotten";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::start(json!({}), AdapterOptions::default()).await;
    let subscriber = Client::connect(&stack.engine.url()).await.expect("connect");
    for (n, config) in [
        json!({"kinds": ["no_such_kind"]}),
        json!({"sandbox_id": "../etc"}),
        json!({"kinds": "stopped"}),
        json!({"unknown": true}),
        json!(["stopped"]),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("bad-{n}");
        subscriber
            .send(
                json!({"type": "registertrigger", "id": id, "trigger_type": TRIGGER_TYPE,
                         "function_id": "raw::on_event", "config": config}),
            )
            .expect("send");
        let result = subscriber
            .next_of_type("triggerregistrationresult", ARRIVE_WITHIN)
            .await
            .unwrap_or_else(|| panic!("no refusal of {config}\n{}", stack.adapter.log()));
        assert_eq!(result["id"], id, "{result}");
        let message = result["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("S001"), "{config}: {result}");
    }
    // An event is never made a call to the adapter's own functions (a `created` sent to
    // `create` would start sandboxes without end), nor the family's or the engine's; nor
    // to a function in a namespace the adapter's calls do not resolve in.
    for (function_id, namespace) in [
        (format!("{PREFIX}::create"), "default"),
        ("sandbox::provider::libkrun::create".to_string(), "default"),
        ("engine::workers::register".to_string(), "default"),
        ("raw::on_event".to_string(), "elsewhere"),
    ] {
        let binding = json!({"type": "registertrigger", "id": function_id,
            "trigger_type": TRIGGER_TYPE, "function_id": function_id, "config": {},
            "namespace": namespace});
        subscriber.send(binding).expect("send");
        let result = subscriber
            .next_of_type("triggerregistrationresult", ARRIVE_WITHIN)
            .await
            .unwrap_or_else(|| panic!("no refusal of {function_id}\n{}", stack.adapter.log()));
        let message = result["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("S001"), "{function_id}: {result}");
    }
    assert_eq!(subscribers(&stack).await, 0);

    for trigger_type in [TRIGGER_TYPE, FAMILY_TRIGGER_TYPE] {
        let binding = json!({"type": "registertrigger", "id": trigger_type,
            "trigger_type": trigger_type, "function_id": "raw::on_event",
            "config": {"kinds": ["ready"]}});
        subscriber.send(binding).expect("send");
    }
    wait_subscribers(&stack, 2).await;
    // Its events arrive as calls to its function.
    subscriber
        .announce("raw-event-subscriber", None)
        .expect("announce");
    subscriber
        .register_function("raw::on_event", None, None, None)
        .expect("register");
    stack
        .client
        .wait_for_function("raw::on_event", None, ARRIVE_WITHIN)
        .await
        .expect("the subscriber's function is on the bus");
    let id = create(&stack, "python", json!({})).await;
    // One call per binding; neither waits for the other's answer (none comes).
    for _ in 0..2 {
        let call = subscriber
            .next_of_type("invokefunction", ARRIVE_WITHIN)
            .await
            .unwrap_or_else(|| panic!("an event call per binding\n{}", stack.adapter.log()));
        assert_eq!(call["function_id"], "raw::on_event", "{call}");
        assert_eq!(call["data"]["kind"], "ready", "{call}");
        assert_eq!(call["data"]["sandbox_id"], id, "{call}");
    }
    subscriber.abort();
    wait_subscribers(&stack, 0).await;
    stop(&stack, &id, true).await;
    // Serving a trigger type costs the operator no deprecation warning on every start.
    let log = stack.adapter.log();
    assert!(!log.contains("deprecated"), "{log}");
}

/// A subscriber that sleeps 30 s per event: creates and execs take what they take without
/// one, it is dropped once its queue is full, and the adapter says so once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_delays_nothing_and_is_dropped() {
    let test = "a_slow_subscriber_delays_nothing_and_is_dropped";
    let Some(sdk) = python_sdk(test) else {
        return;
    };
    let stack = Stack::start(json!({}), AdapterOptions::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let id = create(&stack, "python", json!({})).await;
    // Warm: the image is prepared and the first exec paid.
    exec_ok(&stack, &id, sh("true")).await;

    let (creates_without, execs_without) = timings(&stack, &id, 3, 60).await;
    let slow = Subscriber::start(&stack, &sdk, dir.path(), "slow", json!({}), 30.0).await;
    wait_subscribers(&stack, 1).await;
    // One event in delivery, 256 queued, and more: 300 execs' worth of events.
    let (creates_with, execs_with) = timings(&stack, &id, 3, 150).await;
    wait_subscribers(&stack, 0).await;
    let log = stack.adapter.log();
    assert_eq!(
        log.matches("does not keep up").count(),
        1,
        "one warning for the dropped subscriber:\n{log}"
    );
    assert!(
        slow.events().len() <= 2,
        "{:?} (a 30 s handler takes one event, or two past a delivery timeout)",
        slow.events()
    );

    let (create_without, create_with) = (median(creates_without), median(creates_with));
    let (exec_without, exec_with) = (median(execs_without), median(execs_with));
    println!(
        "bench events_slow_subscriber exec_median_ms without={exec_without:.2} with={exec_with:.2} \
         create_median_ms without={create_without:.1} with={create_with:.1}"
    );
    assert!(
        exec_with < exec_without * 3.0 + 20.0,
        "execs slowed by a slow subscriber: {exec_without:.2} ms -> {exec_with:.2} ms"
    );
    assert!(
        create_with < create_without * 3.0 + 200.0,
        "creates slowed by a slow subscriber: {create_without:.1} ms -> {create_with:.1} ms"
    );
    stop(&stack, &id, true).await;
}

/// `creates` creates (each stopped after) and `execs` execs in `id`, timed in milliseconds.
async fn timings(stack: &Stack, id: &str, creates: usize, execs: usize) -> (Vec<f64>, Vec<f64>) {
    let mut created = Vec::new();
    for _ in 0..creates {
        let started = Instant::now();
        let new = create(stack, "python", json!({})).await;
        created.push(started.elapsed().as_secs_f64() * 1000.0);
        stop(stack, &new, true).await;
    }
    let mut ran = Vec::new();
    for _ in 0..execs {
        let started = Instant::now();
        let answer = stack
            .client
            .invoke(
                &format!("{PREFIX}::exec"),
                json!({"sandbox_id": id, "argv": ["true"]}),
                Duration::from_secs(30),
            )
            .await
            .unwrap_or_else(|e| panic!("exec: {e:?}\n{}", stack.adapter.log()));
        ran.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(answer["exit_code"], 0, "{answer}");
    }
    (created, ran)
}

/// A worker VM's program starting and ending reach a subscriber (raw protocol, answering each
/// call as an SDK would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_vms_starting_and_exiting_are_events() {
    let test = "worker_vms_starting_and_exiting_are_events";
    if !bwrap_usable(test) {
        return;
    }
    let project = e2e_tests::host_dir();
    let stack = Stack::start(json!({}), worker_support::compose_options(project.path())).await;
    let subscriber = Client::connect(&stack.engine.url()).await.expect("connect");
    subscriber
        .announce("raw-worker-event-subscriber", None)
        .expect("announce");
    subscriber
        .register_function("raw::on_worker_event", None, None, None)
        .expect("register");
    stack
        .client
        .wait_for_function("raw::on_worker_event", None, ARRIVE_WITHIN)
        .await
        .expect("the subscriber's function is on the bus");
    let binding = json!({"type": "registertrigger", "id": "workers", "trigger_type": TRIGGER_TYPE,
        "function_id": "raw::on_worker_event",
        "config": {"kinds": ["worker_started", "worker_exited"]}});
    subscriber.send(binding).expect("send");
    wait_subscribers(&stack, 1).await;

    let vm_id = "events-worker";
    worker_support::worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": vm_id, "image": "python", "host_path": project.path()}),
    )
    .await;
    worker_support::worker_ok(
        &stack,
        "start",
        json!({"vm_id": vm_id, "command": ["/bin/sh", "-c", "exit 7"]}),
    )
    .await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let call = subscriber
            .next_of_type("invokefunction", ARRIVE_WITHIN)
            .await
            .unwrap_or_else(|| panic!("worker events: {seen:?}\n{}", stack.adapter.log()));
        let invocation = call["invocation_id"].as_str().expect("a call to answer");
        subscriber
            .answer(invocation, "raw::on_worker_event", Ok(json!({})))
            .expect("answer");
        seen.push(call["data"].clone());
    }
    assert_eq!(seen[0]["kind"], "worker_started", "{seen:?}");
    assert_eq!(seen[0]["vm_id"], vm_id, "{seen:?}");
    assert_eq!(seen[0]["image"], "python", "{seen:?}");
    assert!(seen[0].get("sandbox_id").is_none(), "{seen:?}");
    assert_eq!(seen[1]["kind"], "worker_exited", "{seen:?}");
    assert_eq!(seen[1]["vm_id"], vm_id, "{seen:?}");
    assert_eq!(seen[1]["exit_code"], 7, "{seen:?}");
    assert_eq!(seen[1]["stop_requested"], false, "{seen:?}");
    worker_support::worker_ok(&stack, "destroy", json!({ "vm_id": vm_id })).await;
}

/// A call that wakes a paused sandbox (here an exec) is a `resumed` event, as `resume` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_wakes_a_paused_sandbox_is_a_resumed_event() {
    let test = "a_call_that_wakes_a_paused_sandbox_is_a_resumed_event";
    let Some(sdk) = python_sdk(test) else {
        return;
    };
    let stack = Stack::start(json!({}), AdapterOptions::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let all = Subscriber::start(
        &stack,
        &sdk,
        dir.path(),
        "pauses",
        json!({"kinds": ["paused", "resumed"]}),
        0.0,
    )
    .await;
    wait_subscribers(&stack, 1).await;
    let id = create(&stack, "python", json!({})).await;
    match stack.call("pause", json!({"sandbox_id": id})).await {
        Ok(_) => {}
        Err(e) if e2e_tests::s_code(&e) == "S310" && e2e_tests::adapter_user().is_some() => {
            println!(
                "\n*** {test} DID NOT RUN past S310: this ordinary user's adapter has no \
                 cgroup freezer ***\n"
            );
            return;
        }
        Err(e) => panic!("pause: {e:?}\n{}", stack.adapter.log()),
    }
    exec_ok(&stack, &id, json!({"argv": ["true"]})).await;
    let arrived = eventually(ARRIVE_WITHIN, || async {
        of_sandbox(&all.events(), &id).len() >= 2
    })
    .await;
    let events = all.events();
    assert!(arrived, "events: {events:?}\n{}", stack.adapter.log());
    assert_eq!(
        kinds(&of_sandbox(&events, &id)),
        ["paused", "resumed"],
        "{events:?}"
    );
    stop(&stack, &id, true).await;
}
