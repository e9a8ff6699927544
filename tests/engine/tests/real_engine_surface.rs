//! What the engine does as the real engine does, where a worker can turn it against another:
//! worker names sanitised before they are compared, `engine::workers::register` applied to
//! the worker an array's first element names, and HTTP-invoked functions sent from the
//! engine's host with a credential from the engine's environment.

use std::net::SocketAddr;
use std::time::Duration;

use iii_test_engine::client::Client;
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(5);

async fn engine() -> EngineHandle {
    Engine::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("engine starts")
}

/// A raw worker named `name` serving `function`, once the engine lists it.
async fn named_worker(engine: &EngineHandle, function: &str, name: &str) -> Client {
    let worker = Client::connect(&engine.url()).await.unwrap();
    worker
        .register_function(function, None, None, None)
        .unwrap();
    worker.announce(name, None).unwrap();
    worker
        .wait_for_function(function, None, WAIT)
        .await
        .unwrap();
    worker
}

/// `engine::workers::register` with `data` as given (array or object), fire-and-forget.
fn announce_raw(client: &Client, data: Value) {
    client
        .send(json!({"type": "invokefunction", "invocation_id": null,
                     "function_id": "engine::workers::register", "data": data,
                     "action": {"type": "void"}}))
        .unwrap();
}

/// Whether `function` leaves the engine's table within `WAIT`.
async fn gone_from_the_bus(client: &Client, function: &str) -> bool {
    tokio::time::timeout(WAIT, async {
        while client
            .invoke(
                "engine::functions::info",
                json!({ "function_id": function }),
                WAIT,
            )
            .await
            .is_ok()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

async fn worker_entry(client: &Client, id: &str) -> Option<Value> {
    let list = client
        .invoke("engine::workers::list", json!({}), WAIT)
        .await
        .unwrap();
    list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == id)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_differing_by_control_or_bidi_characters_conflict() {
    let engine = engine().await;
    let owner = named_worker(&engine, "owner::f", "sandbox-libkrun").await;
    for variant in [
        "sandbox-libkrun\u{7}",
        "\u{1b}sandbox-libkrun",
        "sandbox-libkrun\u{202e}",
        " sandbox-\u{2066}libkrun\u{2029} ",
    ] {
        let impostor = Client::connect(&engine.url()).await.unwrap();
        impostor.announce(variant, None).unwrap();
        let rejection = impostor
            .next_of_type("registrationrejected", WAIT)
            .await
            .unwrap_or_else(|| panic!("{variant:?} was not refused"));
        assert_eq!(rejection["code"], "WORKER_NAMESPACE_CONFLICT");
        assert_eq!(rejection["worker_name"], "sandbox-libkrun");
        assert_eq!(rejection["owner_worker_id"], owner.worker_id());
        assert!(impostor.next_message(WAIT).await.is_none());
    }
    assert!(owner.is_connected());
    // A stored name is the sanitised one.
    let clean = Client::connect(&engine.url()).await.unwrap();
    clean.announce("\u{1b}[31mred\u{7f}", None).unwrap();
    let entry = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(entry) = worker_entry(&owner, clean.worker_id()).await {
                if !entry["name"].is_null() {
                    break entry;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(entry["name"], "[31mred");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn array_data_claims_a_name_for_another_workers_connection() {
    let engine = engine().await;
    let victim = named_worker(&engine, "victim::f", "victim").await;
    let attacker = named_worker(&engine, "attacker::f", "attacker").await;

    // Positional: [_caller_worker_id, runtime, version, name, description, os, telemetry].
    // Naming a free name renames the victim.
    announce_raw(
        &attacker,
        json!([
            victim.worker_id(),
            "python",
            "1",
            "renamed",
            null,
            "linux",
            null
        ]),
    );
    let renamed = tokio::time::timeout(WAIT, async {
        loop {
            let entry = worker_entry(&attacker, victim.worker_id()).await.unwrap();
            if entry["name"] == "renamed" {
                break entry;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the victim renamed");
    assert_eq!(renamed["runtime"], "python");

    // Naming the attacker's own name: the VICTIM's connection is the one refused and closed.
    announce_raw(
        &attacker,
        json!([
            victim.worker_id(),
            "python",
            "1",
            "attacker",
            null,
            "linux",
            null
        ]),
    );
    let rejection = victim
        .next_of_type("registrationrejected", WAIT)
        .await
        .expect("the victim is rejected");
    assert_eq!(rejection["code"], "WORKER_NAMESPACE_CONFLICT");
    assert_eq!(rejection["owner_worker_id"], attacker.worker_id());
    assert!(victim.next_message(WAIT).await.is_none());
    assert!(!victim.is_connected());
    assert!(
        gone_from_the_bus(&attacker, "victim::f").await,
        "the victim's function outlived it"
    );
    assert!(attacker.is_connected());

    // An object's `_caller_worker_id` is the engine's, whatever the caller wrote.
    let bystander = named_worker(&engine, "bystander::f", "bystander").await;
    announce_raw(
        &attacker,
        json!({"_caller_worker_id": bystander.worker_id(), "name": "attacker"}),
    );
    assert!(bystander
        .next_of_type("registrationrejected", Duration::from_millis(500))
        .await
        .is_none());
    assert!(bystander.is_connected());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_array_or_a_blank_namespace_is_refused() {
    let engine = engine().await;
    let client = Client::connect(&engine.url()).await.unwrap();
    let short = client
        .invoke(
            "engine::workers::register",
            json!([client.worker_id(), "python"]),
            WAIT,
        )
        .await
        .unwrap_err();
    assert_eq!(short.code, "INVALID_ARGUMENTS");
    let blank = client
        .invoke(
            "engine::workers::register",
            json!({"name": "w", "namespace": "  "}),
            WAIT,
        )
        .await
        .unwrap_err();
    assert_eq!(blank.code, "INVALID_NAMESPACE");
    engine.shutdown().await;
}

/// One request read by a test HTTP server: its head (every line ending in CRLF) and body.
struct Heard {
    head: String,
    body: Value,
}

/// Serves one request on `listener` with `status` and `body`; returns what it heard.
async fn serve_once(listener: TcpListener, status: &str, body: &'static str) -> Heard {
    let (mut socket, _) = listener.accept().await.unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head, body_start) = loop {
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the request ended early");
        raw.extend_from_slice(&chunk[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            // Each header line keeps its CRLF.
            break (String::from_utf8(raw[..end + 2].to_vec()).unwrap(), end + 4);
        }
    };
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap();
    while raw.len() < body_start + length {
        let n = socket.read(&mut chunk).await.unwrap();
        raw.extend_from_slice(&chunk[..n]);
    }
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(response.as_bytes()).await.unwrap();
    Heard {
        head,
        body: serde_json::from_slice(&raw[body_start..body_start + length]).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_function_is_called_from_the_engine_with_its_secret() {
    let secret = uuid::Uuid::new_v4().to_string();
    let variable = format!("HTTP_FN_TOKEN_{}", uuid::Uuid::new_v4().simple());
    let engine = Engine::builder()
        .env(&variable, &secret)
        .start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let broken_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broken_url = format!("http://{}", broken_listener.local_addr().unwrap());
    let registrar = Client::connect(&engine.url()).await.unwrap();
    registrar
        .send(json!({"type": "registerfunction", "id": "remote::hook",
                     "invocation": {"url": url, "headers": {"x-extra": "1"},
                                    "auth": {"type": "bearer", "token_key": variable}}}))
        .unwrap();
    registrar
        .send(json!({"type": "registerfunction", "id": "remote::broken",
                     "invocation": {"url": broken_url, "method": "PUT"}}))
        .unwrap();
    registrar.announce("registrar", None).unwrap();
    let caller = Client::connect(&engine.url()).await.unwrap();
    caller
        .wait_for_function("remote::hook", None, WAIT)
        .await
        .unwrap();
    let server = tokio::spawn(serve_once(listener, "200 OK", r#"{"answer":42}"#));
    let result = caller
        .invoke("remote::hook", json!({"q": "x"}), WAIT)
        .await
        .unwrap();
    assert_eq!(result, json!({"answer": 42}));
    let heard = server.await.unwrap();
    assert!(
        heard.head.starts_with("POST /hook HTTP/1.1\r\n"),
        "{}",
        heard.head
    );
    assert!(
        heard
            .head
            .contains(&format!("\r\nAuthorization: Bearer {secret}\r\n")),
        "{}",
        heard.head
    );
    assert!(heard.head.contains("\r\nx-extra: 1\r\n"), "{}", heard.head);
    assert_eq!(heard.body["q"], "x");
    assert_eq!(heard.body["_caller_worker_id"], caller.worker_id());

    // An error status is the call's error; the function leaves with its registrar.
    let server = tokio::spawn(serve_once(
        broken_listener,
        "500 Internal Server Error",
        r#"{"error":{"code":"E_HOOK","message":"broken"}}"#,
    ));
    let error = caller
        .invoke("remote::broken", json!({}), WAIT)
        .await
        .unwrap_err();
    assert_eq!(
        (error.code.as_str(), error.message.as_str()),
        ("E_HOOK", "broken")
    );
    assert!(server.await.unwrap().head.starts_with("PUT / HTTP/1.1\r\n"));
    registrar.abort();
    assert!(
        gone_from_the_bus(&caller, "remote::hook").await,
        "the HTTP function outlived its registrar"
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_function_needs_its_variable_and_an_allowed_url() {
    let engine = Engine::builder()
        .http_url_policy(iii_test_engine::UrlPolicy {
            require_https: false,
            block_private_ips: true,
        })
        .start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let registrar = Client::connect(&engine.url()).await.unwrap();
    let unset = format!("HTTP_FN_UNSET_{}", uuid::Uuid::new_v4().simple());
    registrar
        .send(json!({"type": "registerfunction", "id": "remote::private",
                     "invocation": {"url": "http://127.0.0.1:9/"}}))
        .unwrap();
    registrar
        .send(json!({"type": "registerfunction", "id": "remote::nokey",
                     "invocation": {"url": "http://93.184.215.14/",
                                    "auth": {"type": "bearer", "token_key": unset}}}))
        .unwrap();
    registrar
        .register_function("plain::marker", None, None, None)
        .unwrap();
    registrar.announce("registrar", None).unwrap();
    registrar
        .wait_for_function("plain::marker", None, WAIT)
        .await
        .unwrap();
    for id in ["remote::private", "remote::nokey"] {
        let info = registrar
            .invoke("engine::functions::info", json!({"function_id": id}), WAIT)
            .await;
        assert!(info.is_err(), "{id} registered: {info:?}");
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_what_workers_made_the_engine_keep() {
    let engine = engine().await;
    let before = engine.stats();
    assert_eq!(
        (
            before.workers,
            before.functions,
            before.channels,
            before.schema_bytes
        ),
        (0, 0, 0, 0)
    );
    let worker = Client::connect(&engine.url()).await.unwrap();
    let schema = json!({"type": "object", "description": "x".repeat(1000)});
    worker
        .register_function("big::f", None, Some(schema.clone()), None)
        .unwrap();
    worker.announce("big", None).unwrap();
    worker
        .wait_for_function("big::f", None, WAIT)
        .await
        .unwrap();
    worker
        .invoke("engine::channels::create", json!({}), WAIT)
        .await
        .unwrap();
    let after = engine.stats();
    assert_eq!((after.workers, after.functions, after.channels), (1, 1, 1));
    assert_eq!(after.schema_bytes, schema.to_string().len());
    engine.shutdown().await;
}
