//! Sandboxes on the bus through the adapter's bus guard, as iii's code runner uses them: a
//! sandbox created with `network: true` and `III_URL=ws://localhost:<engine port>` runs a
//! program written with `fs::write` that uses the official Python iii-sdk to register
//! `guest::hello` and call host functions. What `sandbox_bus_call` lists works; everything
//! reserved or unlisted is refused at once and by name; a sandbox without network or without
//! `sandbox_bus_access` cannot connect; stopping or reaping a sandbox takes its functions off
//! the bus; a guest flooding the guard slows no other sandbox.
//!
//! The guest image is the `pysdk` fixture (the python image with iii-sdk 0.25.0, see
//! tests/fixtures/iii-sdk-py.txt), built and pushed here once: where PyPI cannot be reached the
//! tests say DID NOT RUN.

mod bus_support;
mod sandbox_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bus_support::{libkrun_under_test, pysdk_image, usable};
use e2e_tests::{AdapterOptions, Stack};
use iii_sdk::runtime::WorkerMetadata;
use iii_sdk::{register_worker, IIIClient, InitOptions, RegisterFunction, WorkerIdentityMode};
use sandbox_support::{create, eventually, exec, exec_ok, stdout};
use serde_json::{json, Value};

const GUEST: &str = include_str!("bus_guest.py");
const PROBE: &str = include_str!("iii_worker.py");
const GUEST_PATH: &str = "/root/guest.py";

/// The stack: bwrap (or libkrun, see [`libkrun_under_test`]), the pysdk image allowed, the
/// bus keys of `bus` on top.
async fn stack_with(bus: Value) -> Stack {
    let mut config = json!({
        "custom_images": {"pysdk": pysdk_image().unwrap()},
        "image_allowlist": ["python", "pysdk"],
    });
    if let (Some(base), Value::Object(bus)) = (config.as_object_mut(), bus) {
        base.extend(bus);
    }
    if !libkrun_under_test() {
        return Stack::start(config, AdapterOptions::default()).await;
    }
    let options = AdapterOptions {
        plugin: e2e_tests::PluginKind::Libkrun,
        prefix: None,
        ..Default::default()
    };
    let stack = Stack::start(config, options).await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    assert_eq!(
        info["backend"]["ready"], true,
        "libkrun must boot here: {info}"
    );
    stack
}

fn engine_port(stack: &Stack) -> u16 {
    let url = stack.engine.url();
    url.rsplit_once(':')
        .and_then(|(_, port)| port.trim_end_matches('/').parse().ok())
        .expect("the engine's port")
}

/// The code runner's create: the image, network, and the engine's URL at the guest's
/// localhost.
async fn code_runner_sandbox(stack: &Stack) -> String {
    bus_support::guest_sandbox(stack, GUEST_PATH, GUEST).await
}

/// A worker of the host, named `host-worker`, serving `ids` (each answers `{echo: input}`).
fn host_worker(stack: &Stack, ids: &[&str]) -> IIIClient {
    let worker = register_worker(
        &stack.engine.url(),
        InitOptions {
            metadata: Some(WorkerMetadata {
                name: "host-worker".into(),
                ..WorkerMetadata::default()
            }),
            identity: WorkerIdentityMode::Explicit,
            ..InitOptions::default()
        },
    );
    for id in ids {
        worker.register_function(
            *id,
            RegisterFunction::new_async(|input: Value| async move { Ok(json!({ "echo": input })) }),
        );
    }
    worker
}

/// The ids `engine::functions::list` shows.
async fn functions(stack: &Stack) -> Vec<String> {
    let list = stack
        .client
        .invoke(
            "engine::functions::list",
            json!({}),
            Duration::from_secs(30),
        )
        .await
        .expect("engine::functions::list");
    list["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .filter_map(|f| f["function_id"].as_str().map(String::from))
        .collect()
}

/// `list`'s `bus_functions` of sandbox `id`.
async fn bus_functions(stack: &Stack, id: &str) -> Value {
    let list = stack.call("list", json!({})).await.expect("list");
    list["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .find(|s| s["sandbox_id"] == id)
        .map(|s| s["bus_functions"].clone())
        .unwrap_or(Value::Null)
}

/// Polls until `function` has left the engine (for at most 10 s more than `after`); how long
/// that took.
async fn gone_from_the_bus(stack: &Stack, function: &str, after: Duration) -> Option<Duration> {
    let started = Instant::now();
    let gone = eventually(after + Duration::from_secs(10), || async {
        !functions(stack).await.iter().any(|f| f == function)
    })
    .await;
    gone.then(|| started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_code_runners_flow_serves_and_calls_through_the_guard_only() {
    if !usable("the_code_runners_flow_serves_and_calls_through_the_guard_only") {
        return;
    }
    let stack = stack_with(json!({
        "sandbox_bus_access": true,
        "sandbox_bus_call": ["host::allowed"],
    }))
    .await;
    // Every wait of the flow is bounded on its own; this bounds them all together, so that a
    // stall (seen once under the VM lab) fails naming the step it stalled in, with the
    // adapter's log, instead of lasting until CI's end.
    let phase = Phase::default();
    let limit = Duration::from_secs(300) + 2 * e2e_tests::call_timeout();
    if tokio::time::timeout(limit, code_runners_flow(&stack, &phase))
        .await
        .is_err()
    {
        panic!(
            "the code runner's flow stalled for {limit:?}, in: {}\nthe adapter's log: {}",
            phase.now(),
            stack.adapter.log()
        );
    }
}

/// The step a long test is in, for its watchdog's message.
#[derive(Default)]
struct Phase(std::sync::Mutex<&'static str>);

impl Phase {
    fn enter(&self, step: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = step;
    }

    fn now(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn code_runners_flow(stack: &Stack, phase: &Phase) {
    phase.enter("the host worker registers host::allowed, host::secret, host::taken");
    let host = host_worker(stack, &["host::allowed", "host::secret", "host::taken"]);
    stack
        .client
        .wait_for_function("host::taken", None, Duration::from_secs(20))
        .await
        .expect("the host worker serves");
    phase.enter("creating the other sandbox and the code runner's");
    let other = create(stack, "python", json!({})).await;
    let id = code_runner_sandbox(stack).await;

    // The guest serves and calls, in an exec that lasts until guest::stop is called.
    let calls = [
        "register:sandbox-libkrun::create",
        "register:host::taken",
        "host::allowed",
        "host::secret",
        "sandbox-libkrun::list",
        "sandbox-libkrun::exec",
        "sandbox::run",
        "configuration::get",
        "engine::functions::list",
    ];
    let mut argv = vec!["python3", GUEST_PATH, "serve"];
    argv.extend(calls);
    let guest = stack.call(
        "exec",
        json!({"sandbox_id": id, "argv": argv, "env": {"OTHER_SANDBOX": other},
               "timeout_ms": 90_000}),
    );
    phase.enter(
        "the guest serves guest::hello and calls; the host calls guest::hello, then guest::stop",
    );
    let (answer, served) = tokio::join!(guest, host_side(stack, &id, &other));
    assert!(
        served,
        "guest::hello never showed; the guest's exec: {answer:?}\nthe adapter's log: {}",
        stack.adapter.log()
    );
    let answer = answer.expect("the guest's exec");
    let out = stdout(&answer);
    let results: Value = out
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no results from the guest: {answer}"));
    println!("the guest's calls: {results}");
    assert_eq!(
        results["host::allowed"]["ok"]["echo"]["marker"],
        "guest-payload-marker"
    );
    for (function, rule) in [
        ("host::secret", "sandbox_bus_call"),
        ("sandbox-libkrun::list", "`sandbox-libkrun::`"),
        ("sandbox-libkrun::exec", "`sandbox-libkrun::`"),
        ("sandbox::run", "`sandbox::`"),
        ("configuration::get", "`configuration::`"),
        ("engine::functions::list", "`engine::`"),
    ] {
        let result = &results[function];
        // Refused by the guard at once: its code, not the guest's 10 s timeout.
        assert_eq!(result["code"], "bus_guard_refused", "{function}: {result}");
        let message = result["message"].as_str().unwrap_or_default();
        assert!(message.contains(rule), "{function}: {message}");
    }
    // The other sandbox ran nothing.
    phase.enter("an exec in the other sandbox");
    let untouched = exec_ok(stack, &other, json!({"argv": ["true"]})).await;
    assert_eq!(untouched["exit_code"], 0);

    // A guest announcing itself as the adapter's worker is refused as a name conflict.
    phase.enter("the guest announces itself as worker sandbox-libkrun");
    let announce = exec_ok(
        stack,
        &id,
        json!({"argv": ["python3", GUEST_PATH, "announce", "sandbox-libkrun"], "timeout_ms": 60_000}),
    )
    .await;
    assert!(
        stdout(&announce).contains("refused WORKER_NAMESPACE_CONFLICT"),
        "{announce}"
    );

    // The log names the sandbox, the function and the rule; never a payload.
    let log = e2e_tests::strip_ansi(&stack.adapter.log());
    let refusal = log
        .lines()
        .find(|l| {
            l.contains("bus guard refused")
                && l.contains("registerfunction")
                && l.contains("sandbox-libkrun::create")
        })
        .unwrap_or_else(|| panic!("no refusal logged: {log}"));
    assert!(refusal.contains(&id), "{refusal}");
    assert!(
        !log.contains("guest-payload-marker"),
        "a payload reached the log"
    );

    // Stopping the sandbox takes its functions off the bus.
    phase.enter("stopping the code runner's sandbox, guest::hello leaving the bus");
    sandbox_support::stop(stack, &id, false).await;
    let took = gone_from_the_bus(stack, "guest::hello", Duration::ZERO).await;
    println!("guest::hello left the bus {took:?} after stop");
    assert!(took.is_some(), "guest::hello outlived its sandbox");
    phase.enter("the host worker shuts down");
    host.shutdown_async().await;
}

/// The host's side while the guest serves: calls `guest::hello`, checks what the guest
/// serves, then ends the guest with `guest::stop`. False when `guest::hello` never showed
/// (the caller then says why with the guest's own output, once its exec ends).
async fn host_side(stack: &Stack, id: &str, other: &str) -> bool {
    let served = stack
        .client
        .wait_for_function("guest::hello", None, Duration::from_secs(60))
        .await;
    if served.is_err() {
        return false;
    }
    let hello = stack
        .client
        .invoke(
            "guest::hello",
            json!({"name": "host"}),
            Duration::from_secs(30),
        )
        .await
        .expect("guest::hello");
    assert_eq!(hello, json!({"hello": "host", "from": "guest"}));

    // Two functions served: the reserved id and the one the host holds are not the guest's.
    let counted = eventually(Duration::from_secs(10), || async {
        bus_functions(stack, id).await == json!(2)
    })
    .await;
    assert!(counted, "list: {}", bus_functions(stack, id).await);
    assert_eq!(bus_functions(stack, other).await, Value::Null);
    let echoed = stack
        .client
        .invoke("host::taken", json!({"n": 1}), Duration::from_secs(30))
        .await
        .expect("host::taken stays the host's");
    assert_eq!(echoed["echo"]["n"], 1);

    stack
        .client
        .invoke("guest::stop", json!({}), Duration::from_secs(30))
        .await
        .expect("guest::stop");
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn reaping_takes_a_guests_functions_off_the_bus() {
    if !usable("reaping_takes_a_guests_functions_off_the_bus") {
        return;
    }
    let stack = stack_with(json!({"sandbox_bus_access": true})).await;
    let url = format!("ws://localhost:{}", engine_port(&stack));
    // Long enough for the guest to import the SDK and register before it is reaped: a
    // microVM under the VM lab's emulation takes tens of seconds for it, and on a slow lab
    // in CI more than 60.
    let idle = if libkrun_under_test() { 120 } else { 3 };
    // The guest serves past the reaping: only the reaper may take it off the bus.
    let serve_secs = (10 * idle).to_string();
    let id = create(
        &stack,
        "pysdk",
        json!({"network": true,
               "env": {"III_URL": url, "GUEST_SERVE_SECS": serve_secs},
               "idle_timeout_secs": idle}),
    )
    .await;
    stack
        .call(
            "fs::write",
            json!({"sandbox_id": id, "path": GUEST_PATH, "content": GUEST}),
        )
        .await
        .expect("fs::write");
    // Served in the background: the sandbox is idle once this exec returns.
    exec_ok(
        &stack,
        &id,
        sandbox_support::sh(&format!(
            "setsid python3 {GUEST_PATH} serve </dev/null >/tmp/guest.log 2>&1 &"
        )),
    )
    .await;
    // Until the reaping at the latest: a guest that has not registered by then never will.
    if let Err(e) = stack
        .client
        .wait_for_function("guest::hello", None, Duration::from_secs(idle.max(60)))
        .await
    {
        panic!(
            "guest::hello was not served before the sandbox's idle reaping ({idle} s): {e:?}\n{}",
            stack.adapter.log()
        );
    }
    let took = gone_from_the_bus(&stack, "guest::hello", Duration::from_secs(idle)).await;
    println!("guest::hello left the bus {took:?} after it showed (idle timeout {idle} s)");
    assert!(took.is_some(), "guest::hello outlived its reaped sandbox");
    // A sandbox whose guest left the bus for another reason (under the VM lab's emulation, a
    // reset) is still listed, with its cause: shown, so the lab tells it apart.
    let reaped = eventually(Duration::from_secs(30), || async {
        !sandbox_support::live_ids(&stack).await.contains(&id)
    })
    .await;
    if !reaped {
        let list = stack.call("list", json!({})).await.expect("list");
        panic!(
            "the sandbox was not reaped: {list}\n{}",
            stack.adapter.log()
        );
    }
}

/// One probe of `host:port` from inside sandbox `id` (iii_worker.py's: "refused MS", "ok", ...).
async fn probe(stack: &Stack, id: &str, host: &str, port: u16) -> String {
    let answer = exec_ok(
        stack,
        id,
        json!({"argv": ["python3", "-c", PROBE, "probe", host, port.to_string()], "timeout_ms": 60_000}),
    )
    .await;
    stdout(&answer).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn without_access_or_without_network_a_sandbox_cannot_connect() {
    if !usable("without_access_or_without_network_a_sandbox_cannot_connect") {
        return;
    }
    let bait = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bait_port = bait.local_addr().unwrap().port();

    // Access off (the default): refused at once, and the log says which key would allow it.
    let off = stack_with(json!({})).await;
    let port = engine_port(&off);
    let id = code_runner_sandbox(&off).await;
    for host in ["127.0.0.1", "localhost"] {
        let verdict = probe(&off, &id, host, port).await;
        println!("access off, {host}:{port}: {verdict}");
        assert!(verdict.contains(" refused "), "{verdict}");
    }
    let log = e2e_tests::strip_ansi(&off.adapter.log());
    let hints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&id) && l.contains("sandbox_bus_access"))
        .collect();
    assert_eq!(hints.len(), 1, "{log}");

    // Access on, no network: nothing listens either.
    let on = stack_with(json!({"sandbox_bus_access": true})).await;
    let port = engine_port(&on);
    let url = format!("ws://localhost:{port}");
    let closed = create(&on, "pysdk", json!({"env": {"III_URL": url}})).await;
    let verdict = probe(&on, &closed, "127.0.0.1", port).await;
    println!("access on, no network: {verdict}");
    assert!(verdict.contains(" refused "), "{verdict}");

    // Access on, network: the engine's port opens (to the guard), no other host port does.
    let open = code_runner_sandbox(&on).await;
    let verdict = probe(&on, &open, "127.0.0.1", bait_port).await;
    println!("access on, a bait on the host's loopback: {verdict}");
    assert!(verdict.contains(" refused "), "{verdict}");
    let greeting = exec_ok(
        &on,
        &open,
        json!({"argv": ["python3", "-c", format!(
            "from websockets.sync.client import connect\n\
             with connect('ws://127.0.0.1:{port}', open_timeout=10) as ws:\n    print(ws.recv(timeout=10))"
        )], "timeout_ms": 60_000}),
    )
    .await;
    assert!(stdout(&greeting).contains("workerregistered"), "{greeting}");
    drop(bait);
}

/// Median of `samples` (milliseconds).
fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// `count` execs of `true` in sandbox `id`, each timed.
async fn exec_times(stack: &Stack, id: &str, count: usize) -> Vec<f64> {
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let answer = exec(stack, id, json!({"argv": ["true"]}))
            .await
            .expect("exec");
        assert_eq!(answer["exit_code"], 0);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_flooding_the_guard_slows_no_other_sandbox() {
    if !usable("a_guest_flooding_the_guard_slows_no_other_sandbox") {
        return;
    }
    let stack = stack_with(json!({"sandbox_bus_access": true})).await;
    let bystander = create(&stack, "python", json!({})).await;
    let flooder = code_runner_sandbox(&stack).await;
    exec_times(&stack, &bystander, 5).await; // warm
    let before = median(exec_times(&stack, &bystander, 21).await);

    let flooding = AtomicBool::new(true);
    let flood = async {
        let answer = stack
            .call(
                "exec",
                json!({"sandbox_id": flooder, "argv": ["python3", GUEST_PATH, "flood", "10000"],
                       "timeout_ms": 110_000}),
            )
            .await;
        flooding.store(false, Ordering::Relaxed);
        answer
    };
    let measure = async {
        let mut during = Vec::new();
        while flooding.load(Ordering::Relaxed) && during.len() < 5000 {
            during.extend(exec_times(&stack, &bystander, 1).await);
        }
        during
    };
    let started = Instant::now();
    let (answer, during) = tokio::join!(flood, measure);
    let took = started.elapsed();
    let answer = answer.expect("the flood's exec");
    let out = stdout(&answer);
    println!(
        "flood: {} in {took:?}; bystander's exec median {before:.1} ms before, {:.1} ms during ({} samples)",
        out.trim(),
        if during.is_empty() { 0.0 } else { median(during.clone()) },
        during.len()
    );
    assert!(out.contains("flood answered 10000"), "{answer}");
    assert!(during.len() >= 5, "too few samples during the flood");
    let during = median(during);
    assert!(
        during <= 2.0 * before,
        "the flood slowed another sandbox's exec: median {during:.1} ms, {before:.1} ms before"
    );
    // The adapter kept serving, and logged the flood's refusals by count, not line by line.
    let log = e2e_tests::strip_ansi(&stack.adapter.log());
    let lines = log
        .lines()
        .filter(|l| l.contains("bus guard refused"))
        .count();
    assert!(lines <= 64, "{lines} refusal lines");
}
