//! Attacks a sandbox on the bus (`sandbox_bus_access: true`, bwrap) makes on the host through
//! the adapter's bus guard, each one that worked against the real iii engine; every test
//! asserts the attack FAILED. The test engine does what the real engine does where these
//! attacks depend on it (tests/engine/README.md): it sanitises worker names before comparing
//! them, reads `engine::workers::register`'s array data positionally (its first element is
//! the worker the announcement applies to), and sends HTTP-invoked functions' calls itself,
//! with a credential from its own environment.
//!
//! The same attacks come from a Compose worker VM too (`worker::prepare`/`start` on bwrap):
//! its guest is behind the same guard in worker mode, where the ids it serves and calls are
//! open but announcements, `engine::` and HTTP-invoked functions are judged as strictly.
//!
//! Where `SANDBOX_E2E_NETWORK_PLUGIN=libkrun` (the VM lab runs them so) the same attacks come
//! from libkrun microVMs instead, sandboxes and worker VMs alike: their guests reach the guard
//! through TSI in the runner's network namespace and pasta's forward of the engine's port
//! there, not through a bwrap sandbox's gate, and the microVM must boot.
//!
//! The guest is `bus_attacks.py`, raw protocol frames from the `pysdk` fixture image (built
//! and pushed once, see bus_guard.rs); where bwrap, pasta or that image are missing the tests
//! say DID NOT RUN. The guard's refusal texts are not asserted, only outcomes: the adapter
//! alive and serving, the host's workers and functions unchanged, nothing sent from the host,
//! and bounds on what the engine and the adapter's log were made to hold.

mod bus_support;
mod sandbox_support;
mod worker_support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_support::{libkrun_under_test, pysdk_image, usable};
use e2e_tests::{Adapter, AdapterOptions, Client, Stack, PREFIX};
use iii_sdk::runtime::WorkerMetadata;
use iii_sdk::{register_worker, IIIClient, InitOptions, RegisterFunction, WorkerIdentityMode};
use iii_test_engine::{Engine, EngineStats};
use sandbox_support::{create, stdout};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ATTACKS: &str = include_str!("bus_attacks.py");
const ATTACKS_PATH: &str = "/root/attacks.py";
const WAIT: Duration = Duration::from_secs(20);

/// `bwrap` on bwrap; on libkrun `bwrap` plus the time a microVM's boot may take (the VM lab
/// boots under emulation and waits up to `SANDBOX_LIBKRUN_BOOT_TIMEOUT_SECS` a boot, which
/// `call_timeout` covers twice): for waits that span a guest's boot or its slower programs.
fn on_backend(bwrap: Duration) -> Duration {
    if libkrun_under_test() {
        bwrap + e2e_tests::call_timeout()
    } else {
        bwrap
    }
}

/// The stack with sandboxes on the bus and the bus keys of `bus`, its engine's environment
/// holding `env` (the engine runs in this process: its builder, not this process's
/// environment, gives it a secret).
async fn stack_with(bus: Value, env: &[(&str, &str)]) -> Stack {
    let mut extra = json!({"sandbox_bus_access": true});
    if let (Some(base), Value::Object(bus)) = (extra.as_object_mut(), bus) {
        base.extend(bus);
    }
    stack_from(extra, env, &AdapterOptions::default()).await
}

/// The stack for worker VMs of the Compose directory `compose` (the worker token set), with
/// the configuration keys of `extra`. Sandboxes stay off the bus: a worker VM is behind the
/// guard whatever `sandbox_bus_access` says, and only the sandbox of another tenant is made.
async fn worker_stack(compose: &Path, extra: Value, env: &[(&str, &str)]) -> Stack {
    stack_from(extra, env, &worker_support::compose_options(compose)).await
}

/// The stack with the pysdk image allowed, the configuration keys of `extra`, the engine's
/// environment holding `env`, and the adapter started with `options`.
async fn stack_from(extra: Value, env: &[(&str, &str)], options: &AdapterOptions) -> Stack {
    let mut options = options.clone();
    if libkrun_under_test() {
        // Under the libkrun plugin's own adapter name, which is the one these tests use.
        options.plugin = e2e_tests::PluginKind::Libkrun;
        options.prefix = None;
    }
    let mut keys = json!({
        "custom_images": {"pysdk": pysdk_image().unwrap()},
        "image_allowlist": ["python", "pysdk"],
    });
    if let (Some(base), Value::Object(extra)) = (keys.as_object_mut(), extra) {
        base.extend(extra);
    }
    let state_dir = e2e_tests::host_dir();
    let config = e2e_tests::config_with(state_dir.path(), keys);
    let mut builder = Engine::with_config(options.config_name.clone(), config);
    for (name, value) in env {
        builder = builder.env(*name, *value);
    }
    let engine = builder
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("start engine");
    let adapter = Adapter::spawn(&engine.url(), &options);
    let client = Client::connect(&engine.url()).await.expect("client");
    // 60 s, or `SANDBOX_E2E_START_WAIT_S` as `Stack::start` waits (the VM lab, where loading
    // a debug plugin under emulation takes most of a minute on a busy host).
    let wait = std::env::var("SANDBOX_E2E_START_WAIT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(60), Duration::from_secs);
    let ready = client
        .wait_for_function(&format!("{PREFIX}::adapter::info"), None, wait)
        .await;
    assert!(
        ready.is_ok(),
        "adapter did not register: {ready:?}\n{}",
        adapter.log()
    );
    let stack = Stack {
        engine,
        client,
        adapter,
        state_dir,
    };
    if libkrun_under_test() {
        // A backend that cannot boot would refuse every create: the attacks must meet a
        // microVM, so a refusing backend fails here instead of passing for want of a guest.
        let info = stack.call("adapter::info", json!({})).await.expect("info");
        assert_eq!(
            info["backend"]["ready"], true,
            "libkrun must boot here: {info}"
        );
    }
    stack
}

/// A sandbox on the bus with network, the engine at its localhost, `bus_attacks.py` written.
async fn attacker_sandbox(stack: &Stack) -> String {
    bus_support::guest_sandbox(stack, ATTACKS_PATH, ATTACKS).await
}

/// How long one attack's exec may run: 120 s; on libkrun up to a minute less than the client
/// waits for the exec's answer (`call_timeout`, longer where the lab's boots are slow), whose
/// programs run under emulation there.
fn attack_timeout() -> Duration {
    let bwrap = Duration::from_secs(120);
    if libkrun_under_test() {
        bwrap.max(e2e_tests::call_timeout().saturating_sub(Duration::from_secs(60)))
    } else {
        bwrap
    }
}

/// Runs `bus_attacks.py MODE ARGS...` in `id`; the JSON line it printed, or
/// `{"exec_error": ..}` when the exec itself failed (an attack that took the adapter down
/// ends its own exec; the checks after it say what happened).
async fn attack(stack: &Stack, id: &str, args: &[&str]) -> Value {
    let mut argv = vec!["python3", ATTACKS_PATH];
    argv.extend(args);
    let answer = match sandbox_support::exec(
        stack,
        id,
        json!({"argv": argv, "timeout_ms": attack_timeout().as_millis() as u64}),
    )
    .await
    {
        Ok(answer) => answer,
        Err(error) => return json!({ "exec_error": format!("{error:?}") }),
    };
    stdout(&answer)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON from the attack {args:?}: {answer}"))
}

/// Like [`attack`], sampling what the engine holds every 50 ms while it runs: the most of
/// each count seen (what a guest holds goes when its connection does).
async fn attack_sampled(stack: &Stack, id: &str, args: &[&str]) -> (Value, EngineStats) {
    let done = AtomicBool::new(false);
    let run = async {
        let outcome = attack(stack, id, args).await;
        done.store(true, Ordering::SeqCst);
        outcome
    };
    let sample = async {
        let mut most = stack.engine.stats();
        while !done.load(Ordering::SeqCst) {
            let now = stack.engine.stats();
            most = EngineStats {
                workers: most.workers.max(now.workers),
                functions: most.functions.max(now.functions),
                channels: most.channels.max(now.channels),
                schema_bytes: most.schema_bytes.max(now.schema_bytes),
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        most
    };
    tokio::join!(run, sample)
}

/// A host worker named `name` (in `namespace`, else `default`) serving `ids`; each answers
/// `{echo: input}` and counts its calls in `calls`.
fn host_worker(
    stack: &Stack,
    name: &str,
    namespace: Option<&str>,
    ids: &[&str],
    calls: Arc<AtomicUsize>,
) -> IIIClient {
    let worker = register_worker(
        &stack.engine.url(),
        InitOptions {
            metadata: Some(WorkerMetadata {
                name: name.into(),
                namespace: namespace.map(str::to_string),
                ..WorkerMetadata::default()
            }),
            namespace: namespace.map(str::to_string),
            identity: WorkerIdentityMode::Explicit,
            ..InitOptions::default()
        },
    );
    for id in ids {
        let calls = calls.clone();
        worker.register_function(
            *id,
            RegisterFunction::new_async(move |input: Value| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move { Ok(json!({ "echo": input })) }
            }),
        );
    }
    worker
}

/// `engine::workers::list`'s workers.
async fn workers(stack: &Stack) -> Vec<Value> {
    let list = stack
        .client
        .invoke("engine::workers::list", json!({}), WAIT)
        .await
        .expect("engine::workers::list");
    list["workers"].as_array().cloned().unwrap_or_default()
}

/// The id of the one worker named `name`.
async fn worker_id(stack: &Stack, name: &str) -> String {
    let named: Vec<String> = workers(stack)
        .await
        .iter()
        .filter(|w| w["name"] == name)
        .filter_map(|w| w["id"].as_str().map(String::from))
        .collect();
    assert_eq!(named.len(), 1, "workers named {name}: {named:?}");
    named[0].clone()
}

/// The ids `engine::functions::list` shows in `namespace` (every namespace when `None`).
async fn functions(stack: &Stack, namespace: Option<&str>) -> Vec<String> {
    let mut filter = json!({});
    if let Some(ns) = namespace {
        filter["namespace"] = json!(ns);
    }
    let list = stack
        .client
        .invoke("engine::functions::list", filter, WAIT)
        .await
        .expect("engine::functions::list");
    list["functions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|f| f["function_id"].as_str().map(String::from))
        .collect()
}

/// The adapter is alive and still serves another tenant's sandbox.
async fn assert_adapter_serves(stack: &mut Stack, other: &str, after: &str) {
    assert!(
        stack.adapter.is_running(),
        "the adapter died after {after}:\n{}",
        stack.adapter.log()
    );
    let answer = sandbox_support::exec(stack, other, json!({"argv": ["true"]}))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "another tenant's exec failed after {after}: {e:?}\n{}",
                stack.adapter.log()
            )
        });
    assert_eq!(answer["exit_code"], 0, "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_rename_or_evict_the_adapter_or_a_host_worker() {
    if !usable("a_guest_cannot_rename_or_evict_the_adapter_or_a_host_worker") {
        return;
    }
    let mut stack = stack_with(json!({}), &[]).await;
    let victim_calls = Arc::new(AtomicUsize::new(0));
    let victim = host_worker(
        &stack,
        "victim-worker",
        None,
        &["victim::fn"],
        victim_calls.clone(),
    );
    stack
        .client
        .wait_for_function("victim::fn", None, WAIT)
        .await
        .expect("the victim serves");
    let adapter_id = worker_id(&stack, "sandbox-libkrun").await;
    let victim_id = worker_id(&stack, "victim-worker").await;
    let other = create(&stack, "python", json!({})).await;
    let id = attacker_sandbox(&stack).await;

    // The adapter's name with a control or bidi character: the engine would read it as the
    // adapter's name, and its refusal would tell the guest the adapter's worker id.
    let names = attack(&stack, &id, &["names", "sandbox-libkrun"]).await;
    println!("name variants: {names}");
    // Array data naming the adapter's and the victim's worker ids (which a guest that learnt
    // them, by the refusal above or otherwise, can send). The victim first: an attack that
    // takes the adapter down ends the sandbox with it.
    let on_victim = attack(&stack, &id, &["claim", "guest-squatter", &victim_id]).await;
    println!("array claims on the victim: {on_victim}");
    let on_adapter = attack(&stack, &id, &["claim", "guest-squatter-2", &adapter_id]).await;
    println!("array claims on the adapter: {on_adapter}");
    // What the engine does with an announcement is done once it has read it; give the
    // adapter and the victim the time to be refused and to go.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Every outcome is checked and reported together: one attack's success must not hide
    // whether the others worked.
    let mut failures: Vec<String> = Vec::new();
    let listed = workers(&stack).await;
    let entry = |wanted: &str| {
        listed
            .iter()
            .find(|w| w["id"] == wanted)
            .cloned()
            .unwrap_or(Value::Null)
    };
    if entry(&adapter_id)["name"] != "sandbox-libkrun" {
        failures.push(format!(
            "the adapter's worker was renamed or evicted: {}",
            entry(&adapter_id)
        ));
    }
    if entry(&victim_id)["name"] != "victim-worker" {
        failures.push(format!(
            "the victim worker was renamed or evicted: {}",
            entry(&victim_id)
        ));
    }
    let renamed: Vec<&Value> = listed
        .iter()
        .filter(|w| {
            w["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("guest-renamed") || n.starts_with("guest-forged"))
        })
        .collect();
    if !renamed.is_empty() {
        failures.push(format!("workers a guest renamed: {renamed:?}"));
    }
    match stack
        .client
        .invoke("victim::fn", json!({"n": 1}), WAIT)
        .await
    {
        Ok(echoed) if echoed["echo"]["n"] == 1 => {}
        other => failures.push(format!("the victim lost its function: {other:?}")),
    }
    if names.to_string().contains(&adapter_id) {
        failures.push(format!(
            "a refusal told the guest the adapter's worker id: {names}"
        ));
    }
    // Each form went out on a connection the engine's side greeted: the attacks reached as
    // far as a guest can, so their failure is the guard's doing.
    for claim in [&on_victim, &on_adapter] {
        if claim["connected"] != 4 {
            failures.push(format!("a claim's connections were not greeted: {claim}"));
        }
    }
    if !stack.adapter.is_running() {
        failures.push("the adapter died".into());
    } else {
        let answer = sandbox_support::exec(&stack, &other, json!({"argv": ["true"]})).await;
        if !answer.as_ref().is_ok_and(|a| a["exit_code"] == 0) {
            failures.push(format!("another tenant's exec failed: {answer:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "the name attacks worked:\n- {}\nthe adapter's log: {}",
        failures.join("\n- "),
        stack.adapter.log()
    );
    victim.shutdown_async().await;
}

/// A listener on the host's loopback that answers every request `{}` and keeps what it heard.
struct Bait {
    port: u16,
    connections: Arc<AtomicUsize>,
    heard: Arc<Mutex<Vec<u8>>>,
}

impl Bait {
    async fn start() -> Bait {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let (count, record) = (connections.clone(), heard.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let record = record.clone();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 8192];
                    if let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_secs(2), socket.read(&mut buffer)).await
                    {
                        record
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .extend_from_slice(&buffer[..n]);
                    }
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                        .await;
                });
            }
        });
        Bait {
            port,
            connections,
            heard,
        }
    }

    fn heard(&self) -> String {
        String::from_utf8_lossy(&self.heard.lock().unwrap_or_else(|e| e.into_inner())).into()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_make_the_engine_send_its_secrets() {
    if !usable("a_guest_cannot_make_the_engine_send_its_secrets") {
        return;
    }
    let secret = uuid_like();
    let variable = format!("BUS_ATTACK_TOKEN_{}", &uuid_like()[..12]);
    // The lists allow the hooks' ids: only what the guard makes of `invocation` may stop
    // the attack.
    let mut stack = stack_with(
        json!({"sandbox_bus_register": ["guest::*"], "sandbox_bus_call": ["guest::*"]}),
        &[(&variable, &secret)],
    )
    .await;
    let bait = Bait::start().await;
    let other = create(&stack, "python", json!({})).await;
    let id = attacker_sandbox(&stack).await;
    let url = format!("http://127.0.0.1:{}/collect", bait.port);

    // The guest registers and calls its hooks, then holds them while the host calls them
    // too: an HTTP function's call is the engine's to send, whoever makes it.
    let args = ["http", url.as_str(), variable.as_str(), "8"];
    let done = AtomicBool::new(false);
    let guest = async {
        let outcome = attack(&stack, &id, &args).await;
        done.store(true, Ordering::SeqCst);
        outcome
    };
    let host = async {
        let mut answers = Vec::new();
        for hook in [
            "guest::hook-bearer",
            "guest::hook-apikey",
            "guest::hook-hmac",
        ] {
            if listed_while_guest_runs(&stack, hook, &done).await {
                let answer = stack
                    .client
                    .invoke(hook, json!({"from": "host"}), Duration::from_secs(10))
                    .await;
                answers.push(format!("{hook}: {answer:?}"));
            }
        }
        answers
    };
    let (guest, host) = tokio::join!(guest, host);
    println!("the guest saw: {guest}\nthe host's calls: {host:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let heard = bait.heard();
    assert!(
        !heard.contains(&secret),
        "the engine sent its secret to the guest's URL: {heard}"
    );
    assert_eq!(
        bait.connections.load(Ordering::SeqCst),
        0,
        "the engine sent requests to the guest's URL: {heard}"
    );
    assert_adapter_serves(&mut stack, &other, "the HTTP-function attack").await;
}

/// Whether the engine lists `hook`: within 5 s on bwrap; on libkrun, where the guest's Python
/// starts far slower under the lab's emulation, for as long as the guest's attack runs (`done`
/// unset), so the host's calls are made whenever the hooks exist.
async fn listed_while_guest_runs(stack: &Stack, hook: &str, done: &AtomicBool) -> bool {
    if !libkrun_under_test() {
        return stack
            .client
            .wait_for_function(hook, None, Duration::from_secs(5))
            .await
            .is_ok();
    }
    loop {
        let ended = done.load(Ordering::SeqCst);
        if stack
            .client
            .wait_for_function(hook, None, Duration::from_secs(1))
            .await
            .is_ok()
        {
            return true;
        }
        if ended {
            return false;
        }
    }
}

/// 32 random hex digits (the test's secret, and a variable name no environment has).
fn uuid_like() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// At most this much of a sandbox's function schemas may the engine be made to hold.
const MAX_SCHEMA_BYTES: usize = 16 << 20;
/// At most this many channels may a sandbox's flood make the engine create.
const MAX_FLOOD_CHANNELS: usize = 256;

#[tokio::test(flavor = "multi_thread")]
async fn oversized_registrations_are_refused_past_a_ceiling() {
    if !usable("oversized_registrations_are_refused_past_a_ceiling") {
        return;
    }
    let mut stack = stack_with(json!({"sandbox_bus_register": ["guest::*"]}), &[]).await;
    let other = create(&stack, "python", json!({})).await;
    let id = attacker_sandbox(&stack).await;

    let before = stack.engine.stats();
    let (schemas, most) = attack_sampled(
        &stack,
        &id,
        &["schemas", "150", &(1 << 20).to_string(), "10"],
    )
    .await;
    println!("150 x 1 MiB schemas: {schemas}; engine before {before:?}, at most {most:?}");
    let held_bytes = most.schema_bytes.saturating_sub(before.schema_bytes);
    let held_functions = most.functions.saturating_sub(before.functions);
    assert!(
        held_bytes <= MAX_SCHEMA_BYTES,
        "the engine held {held_bytes} bytes of one sandbox's schemas ({held_functions} functions)"
    );
    assert!(
        held_functions < 150,
        "every one of 150 oversized registrations reached the engine"
    );
    assert!(
        schemas["refusals"].as_u64().unwrap_or(0) > 0 || schemas["closed"] == true,
        "the guest was told of no refusal: {schemas}"
    );

    assert_adapter_serves(&mut stack, &other, "the registration flood").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_channel_flood_is_refused_past_its_rate() {
    if !usable("a_channel_flood_is_refused_past_its_rate") {
        return;
    }
    let mut stack = stack_with(json!({}), &[]).await;
    let other = create(&stack, "python", json!({})).await;
    let id = attacker_sandbox(&stack).await;
    let before = stack.engine.stats();
    let flood = attack(&stack, &id, &["channels", "5000"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = stack.engine.stats();
    let created = after.channels.saturating_sub(before.channels);
    println!("channel flood: {flood}; {created} channels created");
    assert!(
        created <= MAX_FLOOD_CHANNELS,
        "a flood of 5000 engine::channels::create made {created} channels"
    );
    assert_adapter_serves(&mut stack, &other, "the channel flood").await;
}

/// At most this much may 15 s of refused calls over reconnecting connections add to the
/// adapter's log.
const MAX_CHURN_LOG_BYTES: usize = 200 * 1024;

#[tokio::test(flavor = "multi_thread")]
async fn refused_call_churn_does_not_flood_the_adapters_log() {
    if !usable("refused_call_churn_does_not_flood_the_adapters_log") {
        return;
    }
    let mut stack = stack_with(json!({}), &[]).await;
    let other = create(&stack, "python", json!({})).await;
    let id = attacker_sandbox(&stack).await;
    let before = stack.adapter.log().len();
    let churn = attack(&stack, &id, &["churn", "15"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let grown = stack.adapter.log().len().saturating_sub(before);
    println!("churn: {churn}; the adapter's log grew {grown} bytes");
    assert!(
        churn["calls"].as_u64().unwrap_or(0) > 0,
        "the churn made no call: {churn}"
    );
    assert!(
        grown <= MAX_CHURN_LOG_BYTES,
        "15 s of refused calls grew the adapter's log by {grown} bytes (bound {MAX_CHURN_LOG_BYTES})"
    );
    assert_adapter_serves(&mut stack, &other, "the churn").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_reach_or_join_another_namespace() {
    if !usable("a_guest_cannot_reach_or_join_another_namespace") {
        return;
    }
    let mut stack = stack_with(
        json!({"sandbox_bus_call": ["host::allowed"], "sandbox_bus_register": ["guest::*"]}),
        &[],
    )
    .await;
    let tenant_calls = Arc::new(AtomicUsize::new(0));
    let tenant = host_worker(
        &stack,
        "tenant-b-worker",
        Some("tenant-b"),
        &["host::allowed"],
        tenant_calls.clone(),
    );
    let reached = sandbox_support::eventually(WAIT, || async {
        functions(&stack, Some("tenant-b"))
            .await
            .iter()
            .any(|f| f == "host::allowed")
    })
    .await;
    assert!(reached, "tenant-b's worker did not register");
    let other = create(&stack, "python", json!({})).await;
    let id = attacker_sandbox(&stack).await;

    let outcome = attack(&stack, &id, &["namespace", "tenant-b", "host::allowed"]).await;
    println!("namespace attack: {outcome}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        tenant_calls.load(Ordering::SeqCst),
        0,
        "the guest's call reached another namespace's worker: {outcome}"
    );
    let joined = functions(&stack, Some("tenant-b")).await;
    assert!(
        !joined.iter().any(|f| f.starts_with("guest::")),
        "the guest registered in another namespace: {joined:?}"
    );
    let announced: Vec<Value> = workers(&stack)
        .await
        .into_iter()
        .filter(|w| w["namespace"] == "tenant-b" && w["name"] != "tenant-b-worker")
        .collect();
    assert!(
        announced.is_empty(),
        "a guest worker announced itself in another namespace: {announced:?}"
    );
    assert_adapter_serves(&mut stack, &other, "the namespace attack").await;
    tenant.shutdown_async().await;
}

/// The name `bus_attacks.py` has in a worker VM's Compose directory (its `/worker`).
const WORKER_ATTACKS: &str = "/worker/attacks.py";

/// A Compose directory holding `bus_attacks.py`, for worker VMs to run it from.
fn attack_compose_dir() -> tempfile::TempDir {
    let dir = e2e_tests::host_dir();
    std::fs::write(dir.path().join("attacks.py"), ATTACKS).unwrap();
    dir
}

/// Runs `command` in a new worker VM `vm_id` of the pysdk image over `compose` until its
/// program ends (at most `within`), then the JSON lines of its log in order, and the log.
/// Should the adapter stop answering, the log is read from the worker's state directory.
async fn run_worker_vm(
    stack: &Stack,
    compose: &Path,
    vm_id: &str,
    command: Vec<String>,
    within: Duration,
) -> (Vec<Value>, String) {
    worker_support::worker_ok(
        stack,
        "prepare",
        json!({"vm_id": vm_id, "image": "pysdk", "host_path": compose}),
    )
    .await;
    worker_support::worker_ok(stack, "start", json!({"vm_id": vm_id, "command": command})).await;
    sandbox_support::eventually(within, || async {
        match worker_support::worker(stack, "status", json!({ "vm_id": vm_id })).await {
            Ok(status) => status["state"] != "running",
            Err(_) => true,
        }
    })
    .await;
    let log = match worker_support::worker(stack, "logs", json!({ "vm_id": vm_id })).await {
        Ok(logs) => logs["content"].as_str().unwrap_or_default().to_string(),
        Err(_) => std::fs::read_to_string(
            stack
                .state_dir
                .path()
                .join("workers")
                .join(vm_id)
                .join("logs/worker.log"),
        )
        .unwrap_or_default(),
    };
    let lines = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (lines, log)
}

/// Runs `work` while another tenant's sandbox `other` execs `true` every 200 ms; what `work`
/// gave, how many execs ran, and each one that failed.
async fn serving_throughout<F: std::future::Future>(
    stack: &Stack,
    other: &str,
    work: F,
) -> (F::Output, usize, Vec<String>) {
    let done = AtomicBool::new(false);
    let run = async {
        let outcome = work.await;
        done.store(true, Ordering::SeqCst);
        outcome
    };
    let probe = async {
        let (mut ran, mut failed) = (0, Vec::new());
        while !done.load(Ordering::SeqCst) {
            let answer = sandbox_support::exec(stack, other, json!({"argv": ["true"]})).await;
            ran += 1;
            if !answer.as_ref().is_ok_and(|a| a["exit_code"] == 0) {
                failed.push(format!("{answer:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (ran, failed)
    };
    let (outcome, (ran, failed)) = tokio::join!(run, probe);
    (outcome, ran, failed)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_vm_cannot_rename_or_evict_the_adapter_or_a_host_worker() {
    if !usable("a_worker_vm_cannot_rename_or_evict_the_adapter_or_a_host_worker") {
        return;
    }
    let compose = attack_compose_dir();
    let mut stack = worker_stack(compose.path(), json!({}), &[]).await;
    let victim_calls = Arc::new(AtomicUsize::new(0));
    let victim = host_worker(
        &stack,
        "victim-worker",
        None,
        &["victim::fn"],
        victim_calls.clone(),
    );
    stack
        .client
        .wait_for_function("victim::fn", None, WAIT)
        .await
        .expect("the victim serves");
    // The guard keeps `engine::workers::list` and the engine's refusals' `owner_worker_id`
    // from a worker VM, so its guest is handed the ids on its command line: a guest that
    // learnt them some other way. The engine must never see the messages that use them.
    let adapter_id = worker_id(&stack, "sandbox-libkrun").await;
    let victim_id = worker_id(&stack, "victim-worker").await;
    let adapter_pid = stack.adapter.pid();
    let other = create(&stack, "python", json!({})).await;

    // The name variants, then array data naming the victim's worker id, then the adapter's
    // (last: an attack that takes the adapter down ends the worker VM with it).
    let script = format!(
        "python3 {WORKER_ATTACKS} names sandbox-libkrun; \
         python3 {WORKER_ATTACKS} claim guest-squatter \"$1\"; \
         python3 {WORKER_ATTACKS} claim guest-squatter-2 \"$2\""
    );
    let command = ["/bin/sh", "-c", &script, "sh", &victim_id, &adapter_id]
        .map(String::from)
        .to_vec();
    let ((lines, log), execs, exec_failures) = serving_throughout(
        &stack,
        &other,
        run_worker_vm(
            &stack,
            compose.path(),
            "attacker",
            command,
            on_backend(Duration::from_secs(60)),
        ),
    )
    .await;
    let names = lines
        .iter()
        .find(|l| l.get("variants").is_some())
        .cloned()
        .unwrap_or_else(|| panic!("no outcome of the name variants in the worker's log: {log}"));
    let claims: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("connected").is_some())
        .collect();
    assert_eq!(
        claims.len(),
        2,
        "the two claims' outcomes, in the worker's log: {log}"
    );
    println!(
        "name variants: {names}\narray claims on the victim: {}\narray claims on the adapter: {}",
        claims[0], claims[1]
    );
    // Every claim's connection got through the guard to the engine and was greeted: the
    // attack reached as far as a worker VM's program can, so its failure is the guard's doing.
    for claim in &claims {
        assert_eq!(
            claim["connected"], 4,
            "a claim's connections were not greeted: {claim}"
        );
    }
    // What the engine does with an announcement is done once it has read it; give the
    // adapter and the victim the time to be refused and to go.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Every outcome is checked and reported together: one attack's success must not hide
    // whether the others worked.
    let mut failures: Vec<String> = Vec::new();
    let listed = workers(&stack).await;
    let entry = |wanted: &str| {
        listed
            .iter()
            .find(|w| w["id"] == wanted)
            .cloned()
            .unwrap_or(Value::Null)
    };
    // The adapter's connection is the one it had: a refused connection would have made it
    // announce itself again, under a new worker id.
    if entry(&adapter_id)["name"] != "sandbox-libkrun" {
        failures.push(format!(
            "the adapter's worker was renamed or evicted: {}",
            entry(&adapter_id)
        ));
    }
    if entry(&victim_id)["name"] != "victim-worker" {
        failures.push(format!(
            "the victim worker was renamed or evicted: {}",
            entry(&victim_id)
        ));
    }
    let renamed: Vec<&Value> = listed
        .iter()
        .filter(|w| {
            w["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("guest-renamed") || n.starts_with("guest-forged"))
                || w["namespace"] == "guest-ns"
        })
        .collect();
    if !renamed.is_empty() {
        failures.push(format!("workers a guest renamed: {renamed:?}"));
    }
    match stack
        .client
        .invoke("victim::fn", json!({"n": 1}), WAIT)
        .await
    {
        Ok(echoed) if echoed["echo"]["n"] == 1 => {}
        other => failures.push(format!("the victim lost its function: {other:?}")),
    }
    if names.to_string().contains(&adapter_id) {
        failures.push(format!(
            "a refusal told the guest the adapter's worker id: {names}"
        ));
    }
    if !stack.adapter.is_running() || stack.adapter.pid() != adapter_pid {
        failures.push("the adapter died".into());
    }
    if execs == 0 || !exec_failures.is_empty() {
        failures.push(format!(
            "another tenant's execs failed during the attacks ({} of {execs}): {exec_failures:?}",
            exec_failures.len()
        ));
    }
    assert!(
        failures.is_empty(),
        "the worker VM's name attacks worked:\n- {}\nthe worker's log: {log}\nthe adapter's log: {}",
        failures.join("\n- "),
        stack.adapter.log()
    );
    assert_adapter_serves(&mut stack, &other, "the worker VM's name attacks").await;
    victim.shutdown_async().await;
}

/// The hooks `bus_attacks.py http` registers: three with the engine's credential, one without.
const HOOKS: [&str; 4] = [
    "guest::hook-bearer",
    "guest::hook-apikey",
    "guest::hook-hmac",
    "guest::hook-plain",
];

/// Runs `bus_attacks.py http` against `bait` in a worker VM of `stack`, its credentials
/// named by `variable`; meanwhile the host calls each hook the engine lists (an HTTP
/// function's call is the engine's to send, whoever makes it). The guest's outcome and the
/// hooks the engine listed.
async fn http_from_worker_vm(
    stack: &Stack,
    compose: &Path,
    bait: &Bait,
    variable: &str,
) -> (Value, Vec<String>) {
    let url = format!("http://127.0.0.1:{}/collect", bait.port);
    let command = ["python3", WORKER_ATTACKS, "http", &url, variable, "5"]
        .map(String::from)
        .to_vec();
    let within = on_backend(Duration::from_secs(60));
    let done = AtomicBool::new(false);
    let guest = async {
        let outcome = run_worker_vm(stack, compose, "hooks", command, within).await;
        done.store(true, Ordering::SeqCst);
        outcome
    };
    let host = async {
        let mut listed: Vec<String> = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(8);
        // On libkrun the worker VM boots first (slowly, under the lab's emulation): the host
        // watches for as long as it runs, so a hook the engine took is never missed.
        while tokio::time::Instant::now() < until
            || (libkrun_under_test() && !done.load(Ordering::SeqCst))
        {
            for hook in functions(stack, None).await {
                if HOOKS.contains(&hook.as_str()) && !listed.contains(&hook) {
                    let answer = stack
                        .client
                        .invoke(&hook, json!({"from": "host"}), Duration::from_secs(5))
                        .await;
                    println!("the host's call of {hook}: {answer:?}");
                    listed.push(hook);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        listed
    };
    let ((lines, log), listed) = tokio::join!(guest, host);
    let outcome = lines
        .into_iter()
        .find(|l| l.get("answers").is_some())
        .unwrap_or_else(|| panic!("no outcome of the HTTP attack in the worker's log: {log}"));
    // The engine's request, if any, may still be on its way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (outcome, listed)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_vm_cannot_make_the_engine_send_requests() {
    if !usable("a_worker_vm_cannot_make_the_engine_send_requests") {
        return;
    }
    let secret = uuid_like();
    let variable = format!("BUS_ATTACK_TOKEN_{}", &uuid_like()[..12]);
    let compose = attack_compose_dir();
    let mut stack = worker_stack(compose.path(), json!({}), &[(&variable, &secret)]).await;
    let bait = Bait::start().await;
    let other = create(&stack, "python", json!({})).await;

    let (guest, listed) = http_from_worker_vm(&stack, compose.path(), &bait, &variable).await;
    println!("the guest saw: {guest}\nhooks the engine listed: {listed:?}");
    let heard = bait.heard();
    assert!(
        !heard.contains(&secret),
        "the engine sent its secret to the guest's URL: {heard}"
    );
    assert_eq!(
        bait.connections.load(Ordering::SeqCst),
        0,
        "the engine sent requests to the guest's URL: {heard}"
    );
    assert!(
        listed.is_empty(),
        "the engine took HTTP-invoked functions from a worker VM: {listed:?}"
    );
    // The guest was told: each registration refused, the connection kept.
    let refused = guest["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["type"] == "registrationrejected")
        .count();
    assert_eq!(refused, HOOKS.len(), "{guest}");
    assert_adapter_serves(&mut stack, &other, "the worker VM's HTTP-function attack").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_vm_allowed_http_functions_never_gets_the_engines_credentials() {
    if !usable("a_worker_vm_allowed_http_functions_never_gets_the_engines_credentials") {
        return;
    }
    let secret = uuid_like();
    let variable = format!("BUS_ATTACK_TOKEN_{}", &uuid_like()[..12]);
    let compose = attack_compose_dir();
    let stack = worker_stack(
        compose.path(),
        json!({"worker_bus_http_functions": true}),
        &[(&variable, &secret)],
    )
    .await;
    let bait = Bait::start().await;

    let (guest, listed) = http_from_worker_vm(&stack, compose.path(), &bait, &variable).await;
    println!("the guest saw: {guest}\nhooks the engine listed: {listed:?}");
    let heard = bait.heard();
    // The hook without credentials is the operator's choice, and the engine calls it: the
    // bait hears that call, so it would have heard the secret had one been sent.
    assert_eq!(listed, ["guest::hook-plain"], "{guest}");
    assert!(
        bait.connections.load(Ordering::SeqCst) > 0 && heard.contains("/collect"),
        "the engine never called the allowed hook: {guest}"
    );
    assert!(
        !heard.contains(&secret),
        "the engine sent its secret to the guest's URL: {heard}"
    );
}
