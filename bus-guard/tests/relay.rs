//! The guard between a guest and the project's test engine, the guest being a worker made
//! with the official Rust `iii-sdk`: what it may serve and call, what it is refused and how,
//! its channels, and the end of its connections when its endpoint closes.

use std::time::Duration;

use bus_guard::{BusGuard, Policy, SandboxBus};
use futures::{SinkExt, StreamExt};
use iii_sdk::helpers::create_channel;
use iii_sdk::protocol::TriggerRequest;
use iii_sdk::runtime::WorkerMetadata;
use iii_sdk::{
    register_worker, Error, IIIClient, InitOptions, RegisterFunction, WorkerIdentityMode,
};
use iii_test_engine::client::Client;
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(20);

async fn engine() -> EngineHandle {
    Engine::start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine starts")
}

fn worker(url: &str, name: &str) -> IIIClient {
    register_worker(
        url,
        InitOptions {
            metadata: Some(WorkerMetadata {
                name: name.into(),
                ..WorkerMetadata::default()
            }),
            identity: WorkerIdentityMode::Explicit,
            ..InitOptions::default()
        },
    )
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn guard(engine: &EngineHandle, call: &[&str]) -> BusGuard {
    let policy = Policy::new(
        &strings(call),
        &strings(&["*"]),
        &strings(&["sandbox-libkrun"]),
        &strings(&["sandbox-libkrun"]),
    )
    .unwrap();
    BusGuard::new(&engine.url(), policy).unwrap()
}

fn guest_url(bus: &SandboxBus) -> String {
    format!("ws://localhost:{}", bus.addr().port())
}

async fn call(iii: &IIIClient, function_id: &str, payload: Value) -> Result<Value, Error> {
    iii.trigger(TriggerRequest {
        function_id: function_id.into(),
        payload,
        action: None,
        timeout_ms: Some(5_000),
    })
    .await
}

/// Polls `check` every 50 ms until it holds; panics after [`WAIT`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ids `engine::functions::list` shows.
async fn functions(client: &Client) -> Vec<String> {
    let list = client
        .invoke("engine::functions::list", json!({}), WAIT)
        .await
        .unwrap();
    list["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["function_id"].as_str().map(String::from))
        .collect()
}

fn refused(result: Result<Value, Error>) -> String {
    match result {
        Err(Error::Remote { code, message, .. }) => {
            assert_eq!(code, bus_guard::REFUSED_CODE, "{message}");
            message
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn echo() -> RegisterFunction {
    RegisterFunction::new_async(|input: Value| async move { Ok(json!({ "echo": input })) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_serves_and_calls_only_what_the_policy_allows() {
    let engine = engine().await;
    let host = worker(&engine.url(), "host-worker");
    host.register_function("host::echo", echo());
    host.register_function("host::secret", echo());
    let client = Client::connect(&engine.url()).await.unwrap();
    client
        .wait_for_function("host::secret", None, WAIT)
        .await
        .unwrap();

    let guard = guard(&engine, &["host::echo"]);
    let bus = guard.open("sb-1").unwrap();
    let guest = worker(&guest_url(&bus), "guest-worker");
    guest.register_function(
        "guest::hello",
        RegisterFunction::new_async(
            |input: Value| async move { Ok(json!({ "hello": input["name"] })) },
        ),
    );
    guest.register_function("sandbox-libkrun::create", echo());
    guest.register_function("host::echo", echo());

    // The host calls the guest's function through the engine.
    client
        .wait_for_function("guest::hello", None, WAIT)
        .await
        .unwrap();
    let answer = client
        .invoke("guest::hello", json!({"name": "host"}), WAIT)
        .await
        .unwrap();
    assert_eq!(answer["hello"], "host");

    // The guest calls what the policy lists, and nothing else.
    let echoed = call(&guest, "host::echo", json!({"n": 1})).await.unwrap();
    assert_eq!(echoed["echo"]["n"], 1);
    let message = refused(call(&guest, "host::secret", json!({})).await);
    assert!(message.contains("sandbox_bus_call"), "{message}");
    for (function, rule) in [
        ("sandbox-libkrun::list", "sandbox-libkrun::"),
        ("sandbox::run", "sandbox::"),
        ("configuration::get", "configuration::"),
        ("engine::functions::list", "engine::"),
    ] {
        let message = refused(call(&guest, function, json!({})).await);
        assert!(message.contains(rule), "{function}: {message}");
    }

    // Its reserved registration never reached the engine; the id the host holds stays the
    // host's (the engine refused it, the guard relayed the refusal).
    let listed = functions(&client).await;
    assert!(listed.contains(&"guest::hello".to_string()), "{listed:?}");
    assert!(
        !listed.contains(&"sandbox-libkrun::create".to_string()),
        "{listed:?}"
    );
    let echoed = client
        .invoke("host::echo", json!({"n": 2}), WAIT)
        .await
        .unwrap();
    assert_eq!(echoed["echo"]["n"], 2);
    eventually("one function served", || async { bus.functions() == 1 }).await;

    // A channel through the guard: bytes in, the same bytes out.
    let channel = create_channel(&guest, Some(4)).await.unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let reader = tokio::spawn(async move { channel.reader.read_all().await });
    channel.writer.write(&payload).await.unwrap();
    channel.writer.close().await.unwrap();
    let received = tokio::time::timeout(WAIT, reader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(received, payload);

    // Closing the endpoint ends the guest's connections: its functions leave the engine.
    let addr = bus.addr();
    drop(bus);
    let mut gone = false;
    for _ in 0..200 {
        if !functions(&client)
            .await
            .contains(&"guest::hello".to_string())
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(gone, "guest::hello outlived its sandbox's endpoint");
    // And the guest cannot come back through it.
    let mut refused = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the endpoint still listens");
    for iii in [guest, host] {
        iii.shutdown_async().await;
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_announcing_the_adapters_name_is_refused_as_a_worker_conflict() {
    let engine = engine().await;
    let guard = guard(&engine, &[]);
    let bus = guard.open("sb-2").unwrap();
    let guest = worker(&guest_url(&bus), "sandbox-libkrun");
    guest.register_function("guest::impostor", echo());
    let deadline = tokio::time::Instant::now() + WAIT;
    let fatal = loop {
        if let Some(fatal) = guest.fatal_error() {
            break fatal;
        }
        assert!(tokio::time::Instant::now() < deadline, "no refusal");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    match fatal {
        Error::RegistrationRejected {
            code, worker_name, ..
        } => {
            assert_eq!(code, "WORKER_NAMESPACE_CONFLICT");
            assert_eq!(worker_name.as_deref(), Some("sandbox-libkrun"));
        }
        other => panic!("{other:?}"),
    }
    let client = Client::connect(&engine.url()).await.unwrap();
    let workers = client
        .invoke("engine::workers::list", json!({}), WAIT)
        .await
        .unwrap();
    let named = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["name"] == "sandbox-libkrun")
        .count();
    assert_eq!(named, 0, "{workers}");
    guest.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_frames_close_only_their_own_connection() {
    let engine = engine().await;
    let guard = guard(&engine, &[]);
    let bus = guard.open("sb-3").unwrap();
    let guest = worker(&guest_url(&bus), "steady-guest");
    guest.register_function("guest::steady", echo());
    let client = Client::connect(&engine.url()).await.unwrap();
    client
        .wait_for_function("guest::steady", None, WAIT)
        .await
        .unwrap();

    let garbage = Message::text("{not json");
    let oversized = Message::binary(vec![b' '; bus_guard::MAX_GUEST_MESSAGE + 1]);
    for bad in [garbage, oversized] {
        let (mut ws, _) = tokio_tungstenite::connect_async(guest_url(&bus))
            .await
            .unwrap();
        // The greeting comes first, then the bad frame ends the connection.
        let _ = ws.send(bad).await;
        let ended = tokio::time::timeout(WAIT, async {
            while let Some(Ok(Message::Text(_))) = ws.next().await {}
        })
        .await;
        assert!(ended.is_ok(), "the guard kept a bad connection open");
    }
    // A path the engine does not serve is refused at the upgrade.
    assert!(
        tokio_tungstenite::connect_async(format!("{}/admin", guest_url(&bus)))
            .await
            .is_err()
    );
    // The well-behaved connection of the same sandbox serves on.
    let answer = client
        .invoke("guest::steady", json!({"n": 3}), WAIT)
        .await
        .unwrap();
    assert_eq!(answer["echo"]["n"], 3);
    guest.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_is_survived_as_the_sdk_survives_it() {
    let engine = engine().await;
    let guard = guard(&engine, &[]);
    let bus = guard.open("sb-5").unwrap();
    let guest = worker(&guest_url(&bus), "restarting-guest");
    guest.register_function("guest::again", echo());
    let client = Client::connect(&engine.url()).await.unwrap();
    client
        .wait_for_function("guest::again", None, WAIT)
        .await
        .unwrap();
    drop(client);

    // The engine goes and comes back on the same port: the guard's connection to it ends,
    // so does the guest's, and the SDK's reconnect lands on a new one.
    let engine = engine.restart().await.unwrap();
    let client = Client::connect(&engine.url()).await.unwrap();
    client
        .wait_for_function("guest::again", None, WAIT)
        .await
        .unwrap();
    let answer = client
        .invoke("guest::again", json!({"n": 4}), WAIT)
        .await
        .unwrap();
    assert_eq!(answer["echo"]["n"], 4);
    eventually("one function served", || async { bus.functions() == 1 }).await;
    guest.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_telemetry_is_taken_and_dropped() {
    let engine = engine().await;
    let guard = guard(&engine, &[]);
    let bus = guard.open("sb-6").unwrap();
    // The Python SDK's exporter: a WebSocket at /otel that only sends.
    let (mut otel, _) = tokio_tungstenite::connect_async(format!("{}/otel", guest_url(&bus)))
        .await
        .expect("the guard takes /otel");
    for _ in 0..3 {
        otel.send(Message::text(r#"{"resourceSpans":[]}"#))
            .await
            .unwrap();
    }
    // Nothing of it reached the engine: no worker, named or not, appeared there.
    let client = Client::connect(&engine.url()).await.unwrap();
    let workers = client
        .invoke("engine::workers::list", json!({}), WAIT)
        .await
        .unwrap();
    assert_eq!(workers["workers"].as_array().unwrap().len(), 1, "{workers}");
    engine.shutdown().await;
}

/// The workers the engine lists under `name`.
async fn named(client: &Client, name: &str) -> Vec<Value> {
    let workers = client
        .invoke("engine::workers::list", json!({}), WAIT)
        .await
        .unwrap();
    workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["name"] == name)
        .cloned()
        .collect()
}

/// Waits until `guest`'s connection has ended (the guard closed it).
async fn closed(guest: &Client) {
    eventually("the guard closed the connection", || async {
        !guest.is_connected()
    })
    .await;
}

/// What succeeded against the engine when the guard forwarded a guest's bytes: a variant
/// of the adapter's worker name the engine's sanitising takes for the name itself, array
/// data read as the caller's worker id, an HTTP-invoked function. Through the guard, the
/// adapter's own connection stays and nothing of them reaches the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_cannot_displace_the_adapter_or_make_the_engine_call_out() {
    let engine = engine().await;
    // The adapter's own worker, as the engine sees it.
    let adapter = Client::connect(&engine.url()).await.unwrap();
    adapter.announce("sandbox-libkrun", None).unwrap();
    adapter
        .register_function("sandbox-libkrun::list", None, None, None)
        .unwrap();
    let client = Client::connect(&engine.url()).await.unwrap();
    client
        .wait_for_function("sandbox-libkrun::list", None, WAIT)
        .await
        .unwrap();
    eventually("the adapter is listed", || async {
        named(&client, "sandbox-libkrun").await.len() == 1
    })
    .await;
    let adapter_id = adapter.worker_id().to_string();

    let guard = guard(&engine, &[]);
    let bus = guard.open("sb-7").unwrap();
    for name in [
        "sandbox-libkrun\u{7}",
        "\u{1b}sandbox-libkrun",
        "sandbox-libkrun\u{202e}",
        "Sandbox-Libkrun",
    ] {
        let guest = Client::connect(&guest_url(&bus)).await.unwrap();
        guest.announce(name, None).unwrap();
        let refusal = guest
            .next_of_type("registrationrejected", WAIT)
            .await
            .expect("a refusal");
        assert_eq!(refusal["code"], "WORKER_NAMESPACE_CONFLICT", "{name:?}");
        assert!(!refusal.to_string().contains(&adapter_id), "{refusal}");
        closed(&guest).await;
    }
    // The engine's `engine::workers::register` reading array data positionally.
    let guest = Client::connect(&guest_url(&bus)).await.unwrap();
    guest
        .send(
            json!({"type":"invokefunction","function_id":"engine::workers::register",
                     "data":[adapter_id, "rust", "0", "evil"],"action":{"type":"void"}}),
        )
        .unwrap();
    let refusal = guest
        .next_of_type("registrationrejected", WAIT)
        .await
        .expect("a refusal");
    assert_eq!(refusal["code"], "WORKER_NAMESPACE_CONFLICT");
    closed(&guest).await;

    // An HTTP-invoked function naming the engine's environment.
    let guest = Client::connect(&guest_url(&bus)).await.unwrap();
    guest
        .send(json!({"type":"registerfunction","id":"guest::lambda",
            "invocation":{"url":"http://127.0.0.1:9/","method":"POST",
                          "auth":{"type":"bearer","token_key":"HOME"}}}))
        .unwrap();
    let refusal = guest
        .next_of_type("registrationrejected", WAIT)
        .await
        .expect("a refusal");
    assert_eq!(refusal["code"], "FUNCTION_NAMESPACE_CONFLICT");
    assert!(
        refusal["owner_worker_id"]
            .as_str()
            .unwrap()
            .contains("http function"),
        "{refusal}"
    );
    // Its connection stays: a plain function still registers.
    guest
        .register_function("guest::plain", None, None, None)
        .unwrap();
    client
        .wait_for_function("guest::plain", None, WAIT)
        .await
        .unwrap();
    assert!(!functions(&client)
        .await
        .contains(&"guest::lambda".to_string()));

    // The adapter is still on the bus, under its name, serving.
    assert!(adapter.is_connected());
    let listed = named(&client, "sandbox-libkrun").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(functions(&client)
        .await
        .contains(&"sandbox-libkrun::list".to_string()));
    engine.shutdown().await;
}

/// A worker VM's guest, a real SDK worker, through the worker mode: it registers and calls
/// openly, but not the reserved ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_vm_serves_and_calls_through_the_worker_mode() {
    let engine = engine().await;
    let host = worker(&engine.url(), "host-worker");
    host.register_function("host::echo", echo());
    let client = Client::connect(&engine.url()).await.unwrap();
    client
        .wait_for_function("host::echo", None, WAIT)
        .await
        .unwrap();
    let guard = guard(&engine, &[]);
    let policy = Policy::worker_vm(
        &strings(&["sandbox-libkrun"]),
        &strings(&["sandbox-libkrun"]),
        false,
    );
    let bus = guard
        .open_with("worker-vm-1", std::sync::Arc::new(policy))
        .unwrap();
    let vm = worker(&guest_url(&bus), "orders-worker");
    vm.register_function("orders::create", echo());
    vm.register_function("engine::impostor", echo());
    client
        .wait_for_function("orders::create", None, WAIT)
        .await
        .unwrap();
    let answer = client
        .invoke("orders::create", json!({"n": 5}), WAIT)
        .await
        .unwrap();
    assert_eq!(answer["echo"]["n"], 5);
    // No list of the guard's calls: a worker calls what it needs.
    let echoed = call(&vm, "host::echo", json!({"n": 6})).await.unwrap();
    assert_eq!(echoed["echo"]["n"], 6);
    let message = refused(call(&vm, "engine::functions::list", json!({})).await);
    assert!(message.contains("engine::"), "{message}");
    assert!(!functions(&client)
        .await
        .contains(&"engine::impostor".to_string()));
    eventually("the worker is listed under its name", || async {
        named(&client, "orders-worker").await.len() == 1
    })
    .await;
    vm.shutdown_async().await;
    host.shutdown_async().await;
    engine.shutdown().await;
}
