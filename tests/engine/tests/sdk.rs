//! The test engine as the official `iii-sdk` sees it: registration, calls, conflicts,
//! listings, configuration, channels, restart, and the error codes.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{call, eventually, remote_code, sdk_worker, until_callable};
use iii_sdk::helpers::create_channel;
use iii_sdk::protocol::TriggerRequest;
use iii_sdk::runtime::{FunctionInfo, WorkerInfo};
use iii_sdk::{Error, RegisterFunction};
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

async fn engine() -> EngineHandle {
    Engine::start(any_port()).await.expect("engine starts")
}

fn echo() -> RegisterFunction {
    RegisterFunction::new_async(|input: Value| async move { Ok(json!({ "echo": input })) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_worker_serves_sdk_caller_through_the_engine() {
    let engine = engine().await;
    let server = sdk_worker(&engine.url(), "echo-server", None);
    server.register_function("demo::echo", echo());
    let caller = sdk_worker(&engine.url(), "echo-caller", None);

    let result = until_callable(&caller, "demo::echo", json!({"n": 1})).await;
    assert_eq!(result["echo"]["n"], 1);

    // The engine stamps the caller's worker id into object data.
    let listed = call(&caller, "engine::workers::list", json!({}))
        .await
        .unwrap();
    let workers: Vec<WorkerInfo> = serde_json::from_value(listed["workers"].clone()).unwrap();
    let caller_id = &workers
        .iter()
        .find(|w| w.name.as_deref() == Some("echo-caller"))
        .expect("caller listed")
        .id;
    assert_eq!(result["echo"]["_caller_worker_id"], json!(caller_id));

    server.shutdown_async().await;
    caller.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_function_is_function_not_found_with_namespace() {
    let engine = engine().await;
    let caller = sdk_worker(&engine.url(), "lost-caller", None);
    let error = eventually("a connected caller", || async {
        match call(&caller, "nope::missing", json!({})).await {
            Err(Error::NotConnected) => None,
            other => Some(other.expect_err("no such function")),
        }
    })
    .await;
    assert_eq!(
        remote_code(&error),
        Some((
            "function_not_found",
            "Function nope::missing not found in namespace default."
        ))
    );
    caller.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_live_in_their_workers_namespace() {
    let engine = engine().await;
    let server = sdk_worker(&engine.url(), "ns-server", Some("team-a"));
    server.register_function("ns::echo", echo());
    let caller = sdk_worker(&engine.url(), "ns-caller", None);

    let request = || TriggerRequest::new("ns::echo", json!({})).namespace("team-a");
    eventually("ns::echo in team-a", || async {
        caller.trigger(request()).await.ok()
    })
    .await;
    let error = call(&caller, "ns::echo", json!({})).await.unwrap_err();
    assert_eq!(
        remote_code(&error),
        Some((
            "function_not_found",
            "Function ns::echo not found in namespace default."
        ))
    );
    server.shutdown_async().await;
    caller.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_function_id_is_refused_and_the_first_owner_keeps_it() {
    let engine = engine().await;
    let first = sdk_worker(&engine.url(), "dup-first", None);
    first.register_function(
        "dup::f",
        RegisterFunction::new_async(|_: Value| async move { Ok(json!("first")) }),
    );
    let caller = sdk_worker(&engine.url(), "dup-caller", None);
    until_callable(&caller, "dup::f", json!({})).await;

    let second = sdk_worker(&engine.url(), "dup-second", None);
    second.register_function(
        "dup::f",
        RegisterFunction::new_async(|_: Value| async move { Ok(json!("second")) }),
    );
    second.register_function("dup::other", echo());
    until_callable(&caller, "dup::other", json!({})).await;

    // Only that one function was refused: the second worker is alive and serving.
    assert!(second.fatal_error().is_none());
    assert_eq!(call(&caller, "dup::f", json!({})).await.unwrap(), "first");
    for iii in [first, second, caller] {
        iii.shutdown_async().await;
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_worker_name_is_fatal_for_the_newcomer_only() {
    let engine = engine().await;
    let first = sdk_worker(&engine.url(), "same-name", None);
    first.register_function("name::first", echo());
    let caller = sdk_worker(&engine.url(), "name-caller", None);
    until_callable(&caller, "name::first", json!({})).await;

    let second = sdk_worker(&engine.url(), "same-name", None);
    second.register_function("name::second", echo());
    let fatal = eventually("the rejection", || async { second.fatal_error() }).await;
    match fatal {
        Error::RegistrationRejected {
            code,
            namespace,
            worker_name,
            ..
        } => {
            assert_eq!(code, "WORKER_NAMESPACE_CONFLICT");
            assert_eq!(namespace, "default");
            assert_eq!(worker_name.as_deref(), Some("same-name"));
        }
        other => panic!("unexpected fatal error {other:?}"),
    }
    assert!(call(&caller, "name::first", json!({})).await.is_ok());
    let error = call(&caller, "name::second", json!({})).await.unwrap_err();
    assert_eq!(remote_code(&error).map(|c| c.0), Some("function_not_found"));
    for iii in [first, second, caller] {
        iii.shutdown_async().await;
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_list_and_functions_info_describe_what_was_registered() {
    let engine = engine().await;
    let server = sdk_worker(&engine.url(), "described", Some("docs"));
    let request_format = json!({"type": "object", "properties": {"x": {"type": "integer"}}});
    let response_format = json!({"type": "object", "required": ["y"]});
    server.register_function(
        "docs::fn",
        echo()
            .description("Doubles x")
            .request_format(request_format.clone())
            .response_format(response_format.clone()),
    );
    let caller = sdk_worker(&engine.url(), "docs-caller", None);

    let info = eventually("docs::fn info", || async {
        call(
            &caller,
            "engine::functions::info",
            json!({"function_id": "docs::fn"}),
        )
        .await
        .ok()
    })
    .await;
    let parsed: FunctionInfo = serde_json::from_value(info.clone()).unwrap();
    assert_eq!(parsed.function_id, "docs::fn");
    assert_eq!(parsed.description.as_deref(), Some("Doubles x"));
    assert_eq!(parsed.request_format, Some(request_format));
    assert_eq!(parsed.response_format, Some(response_format));
    assert_eq!(parsed.namespace.as_deref(), Some("docs"));
    assert_eq!(info["worker_name"], "described");

    let listed = call(&caller, "engine::workers::list", json!({}))
        .await
        .unwrap();
    let workers: Vec<WorkerInfo> = serde_json::from_value(listed["workers"].clone()).unwrap();
    let worker = workers
        .iter()
        .find(|w| w.name.as_deref() == Some("described"))
        .expect("worker listed by name");
    assert_eq!(worker.namespace.as_deref(), Some("docs"));
    assert_eq!(worker.runtime.as_deref(), Some("rust"));
    assert_eq!(worker.status, "connected");
    assert_eq!(worker.functions, vec!["docs::fn".to_string()]);
    assert_eq!(worker.function_count, 1);

    let missing = call(
        &caller,
        "engine::functions::info",
        json!({"function_id": "no::fn"}),
    )
    .await
    .unwrap_err();
    assert_eq!(remote_code(&missing).map(|c| c.0), Some("NOT_FOUND"));
    server.shutdown_async().await;
    caller.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_get_set_and_expansion() {
    let home = std::env::var("HOME").unwrap_or_default();
    let seeded = json!({"home": "${HOME}", "missing": "${III_TEST_ENGINE_UNSET_VAR:fallback}"});
    let engine = Engine::with_config("seeded-cfg", seeded.clone())
        .start(any_port())
        .await
        .unwrap();
    let iii = sdk_worker(&engine.url(), "config-user", None);

    let got = until_callable(&iii, "configuration::get", json!({"id": "seeded-cfg"})).await;
    assert_eq!(got["id"], "seeded-cfg");
    assert_eq!(got["value"], json!({"home": home, "missing": "fallback"}));
    let raw = call(
        &iii,
        "configuration::get",
        json!({"id": "seeded-cfg", "raw": true}),
    )
    .await
    .unwrap();
    assert_eq!(raw["value"], seeded);

    let code = |r: Result<Value, Error>| remote_code(&r.unwrap_err()).map(|c| c.0.to_string());
    let unknown = call(&iii, "configuration::get", json!({"id": "nothing-here"})).await;
    assert_eq!(code(unknown).as_deref(), Some("NOT_FOUND"));
    let bad = call(&iii, "configuration::get", json!({"id": "Not Valid"})).await;
    assert_eq!(code(bad).as_deref(), Some("INVALID_ID"));
    let unregistered = call(
        &iii,
        "configuration::set",
        json!({"id": "fresh", "value": 1}),
    )
    .await;
    assert_eq!(code(unregistered).as_deref(), Some("NOT_REGISTERED"));

    let registration = json!({"id": "fresh", "name": "Fresh", "description": "d",
        "schema": {"type": "integer"}, "initial_value": 1});
    call(&iii, "configuration::register", registration)
        .await
        .unwrap();
    let set = call(
        &iii,
        "configuration::set",
        json!({"id": "fresh", "value": 2}),
    )
    .await
    .unwrap();
    assert_eq!(set, json!({"old_value": 1, "new_value": 2}));
    let got = call(&iii, "configuration::get", json!({"id": "fresh"}))
        .await
        .unwrap();
    assert_eq!(got["value"], 2);
    iii.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_carries_bytes_from_writer_to_reader() {
    let engine = engine().await;
    let iii = sdk_worker(&engine.url(), "channel-user", None);
    until_callable(&iii, "engine::workers::list", json!({})).await;

    let channel = create_channel(&iii, Some(4)).await.unwrap();
    // More frames than the buffer holds: the writer must wait for the reader.
    let payload: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    let reader = tokio::spawn(async move { channel.reader.read_all().await });
    channel.writer.write(&payload).await.unwrap();
    channel.writer.close().await.unwrap();
    let received = tokio::time::timeout(common::WAIT, reader)
        .await
        .expect("reader finishes after the writer closes")
        .unwrap()
        .unwrap();
    assert_eq!(received.len(), payload.len());
    assert!(received == payload, "bytes differ");
    iii.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_worker_reconnects_and_serves_after_engine_restart() {
    let engine = engine().await;
    let server = sdk_worker(&engine.url(), "phoenix", None);
    server.register_function("restart::echo", echo());
    let caller = sdk_worker(&engine.url(), "phoenix-caller", None);
    until_callable(&caller, "restart::echo", json!({"before": true})).await;

    let engine = engine.restart().await.expect("restart on the same port");
    let result = until_callable(&caller, "restart::echo", json!({"after": true})).await;
    assert_eq!(result["echo"]["after"], true);
    server.shutdown_async().await;
    caller.shutdown_async().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_leaving_mid_call_gives_invocation_stopped() {
    let engine = engine().await;
    let server = sdk_worker(&engine.url(), "quitter", None);
    let (entered_tx, entered_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    server.register_function(
        "slow::never",
        RegisterFunction::new_async(move |_: Value| {
            let entered = entered_tx.clone();
            async move {
                let _ = entered.send(());
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(json!(null))
            }
        }),
    );
    server.register_function("slow::ping", echo());
    let caller = sdk_worker(&engine.url(), "waiter", None);
    until_callable(&caller, "slow::ping", json!({})).await;

    let pending = tokio::spawn({
        let caller = caller.clone();
        async move { call(&caller, "slow::never", json!({})).await }
    });
    let mut entered_rx = entered_rx;
    tokio::time::timeout(common::WAIT, entered_rx.recv())
        .await
        .expect("the handler started");
    server.shutdown_async().await;
    let error = pending.await.unwrap().unwrap_err();
    assert_eq!(remote_code(&error).map(|c| c.0), Some("invocation_stopped"));
    caller.shutdown_async().await;
    engine.shutdown().await;
}
