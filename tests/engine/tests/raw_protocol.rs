//! The engine at the wire level, through the raw test client.

use std::net::SocketAddr;
use std::time::Duration;

use iii_test_engine::client::Client;
use iii_test_engine::{Engine, EngineHandle};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(5);

async fn engine() -> EngineHandle {
    Engine::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("engine starts")
}

/// A raw worker named `name` serving `function`, once the engine lists it.
async fn registered_worker(engine: &EngineHandle, function: &str, name: &str) -> Client {
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

/// A raw worker named `name` serving `function`, and a caller that has seen it registered.
async fn worker_and_caller(engine: &EngineHandle, function: &str, name: &str) -> (Client, Client) {
    let worker = registered_worker(engine, function, name).await;
    let caller = Client::connect(&engine.url()).await.unwrap();
    caller
        .wait_for_function(function, None, WAIT)
        .await
        .unwrap();
    (worker, caller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_reaches_a_raw_worker_with_caller_id_stamped() {
    let engine = engine().await;
    let (worker, caller) = worker_and_caller(&engine, "raw::f", "raw-worker").await;
    let call = caller.invoke("raw::f", json!({"x": 1}), WAIT);
    let serve = async {
        let message = worker
            .next_of_type("invokefunction", WAIT)
            .await
            .expect("call arrives");
        assert_eq!(message["data"]["x"], 1);
        assert_eq!(message["data"]["_caller_worker_id"], caller.worker_id());
        let id = message["invocation_id"].as_str().unwrap();
        worker.answer(id, "raw::f", Ok(json!("done"))).unwrap();
    };
    let (result, ()) = tokio::join!(call, serve);
    assert_eq!(result.unwrap(), json!("done"));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_is_answered_and_unknown_types_are_ignored() {
    let engine = engine().await;
    let client = Client::connect(&engine.url()).await.unwrap();
    client
        .send(json!({"type": "somethingnew", "x": 1}))
        .unwrap();
    client.send(json!({"no_type": true})).unwrap();
    client.send(json!({"type": "ping"})).unwrap();
    let pong = client.next_message(WAIT).await.expect("an answer");
    assert_eq!(pong, json!({"type": "pong"}));
    assert!(client.is_connected());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_pings_and_binary_json_frames_are_handled() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let engine = engine().await;
    let (mut ws, response) = tokio_tungstenite::connect_async(engine.url())
        .await
        .unwrap();
    assert_eq!(
        response
            .headers()
            .get("x-iii-capabilities")
            .map(|v| v.as_bytes()),
        Some(&b"tcp-nodelay"[..])
    );
    let greeting = ws.next().await.unwrap().unwrap();
    assert!(greeting.to_text().unwrap().contains("\"workerregistered\""));
    ws.send(Message::Ping(b"hi".to_vec().into())).await.unwrap();
    ws.send(Message::Binary(br#"{"type":"ping"}"#.to_vec().into()))
        .await
        .unwrap();
    let mut saw_pong_frame = false;
    let mut saw_pong_message = false;
    while !(saw_pong_frame && saw_pong_message) {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Message::Pong(payload) => saw_pong_frame = payload.as_ref() == b"hi",
            Message::Text(text) => saw_pong_message = text.as_str() == r#"{"type":"pong"}"#,
            _ => {}
        }
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_conflict_names_the_function_and_its_owner() {
    let engine = engine().await;
    let first = registered_worker(&engine, "dup::f", "first").await;

    let second = Client::connect(&engine.url()).await.unwrap();
    second
        .register_function("dup::f", None, None, None)
        .unwrap();
    second
        .register_function("dup::g", None, None, None)
        .unwrap();
    second.announce("second", None).unwrap();
    let rejection = second
        .next_of_type("registrationrejected", WAIT)
        .await
        .expect("a rejection");
    assert_eq!(
        rejection,
        json!({"type": "registrationrejected", "code": "FUNCTION_NAMESPACE_CONFLICT",
               "namespace": "default", "function_id": "dup::f",
               "owner_worker_id": first.worker_id()})
    );
    second
        .wait_for_function("dup::g", None, WAIT)
        .await
        .unwrap();
    assert!(second.is_connected());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_name_conflict_closes_only_the_newcomer() {
    let engine = engine().await;
    let first = Client::connect(&engine.url()).await.unwrap();
    first
        .register_function("name::f", None, None, None)
        .unwrap();
    first.announce("twin", Some("ns1")).unwrap();
    first
        .wait_for_function("name::f", Some("ns1"), WAIT)
        .await
        .unwrap();

    // The same name in another namespace is no conflict.
    let elsewhere = Client::connect(&engine.url()).await.unwrap();
    elsewhere.announce("twin", Some("ns2")).unwrap();

    let second = Client::connect(&engine.url()).await.unwrap();
    second
        .register_function("name::g", None, None, None)
        .unwrap();
    second.announce("twin", Some("ns1")).unwrap();
    let rejection = second
        .next_of_type("registrationrejected", WAIT)
        .await
        .expect("a rejection");
    assert_eq!(
        rejection,
        json!({"type": "registrationrejected", "code": "WORKER_NAMESPACE_CONFLICT",
               "namespace": "ns1", "worker_name": "twin",
               "owner_worker_id": first.worker_id()})
    );
    assert!(
        second.next_message(WAIT).await.is_none(),
        "connection closed"
    );
    assert!(!second.is_connected());
    assert!(first.is_connected() && elsewhere.is_connected());
    let error = first
        .invoke_in("ns1", "name::g", json!({}), WAIT)
        .await
        .unwrap_err();
    assert_eq!(error.code, "function_not_found");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_wait_for_the_namespace_then_fall_back_to_default() {
    let engine = Engine::builder()
        .registration_grace(Duration::from_millis(300))
        .start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let silent = Client::connect(&engine.url()).await.unwrap();
    silent
        .register_function("held::f", None, None, None)
        .unwrap();
    let caller = Client::connect(&engine.url()).await.unwrap();
    caller
        .invoke("engine::workers::list", json!({}), WAIT)
        .await
        .unwrap();
    let early = caller.invoke("held::f", json!({}), WAIT).await.unwrap_err();
    assert_eq!(
        early.message,
        "Function held::f not found in namespace default."
    );
    caller
        .wait_for_function("held::f", Some("default"), WAIT)
        .await
        .unwrap();

    let named = Client::connect(&engine.url()).await.unwrap();
    named
        .register_function("held::g", None, None, None)
        .unwrap();
    named.announce("named", Some("team")).unwrap();
    caller
        .wait_for_function("held::g", Some("team"), WAIT)
        .await
        .unwrap();
    let info = caller
        .invoke(
            "engine::functions::info",
            json!({"function_id": "held::g"}),
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(info["namespace"], "team");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reattach_with_the_right_token_retires_the_old_connection() {
    let engine = engine().await;
    let old = registered_worker(&engine, "re::f", "phoenix").await;

    let intruder = Client::connect(&engine.url()).await.unwrap();
    intruder
        .send(
            json!({"type": "reattach", "previous_worker_id": old.worker_id(),
                     "reattach_token": "wrong"}),
        )
        .unwrap();
    intruder.send(json!({"type": "ping"})).unwrap();
    intruder.next_of_type("pong", WAIT).await.expect("pong");
    assert!(old.is_connected(), "a wrong token retires nothing");

    let new = Client::connect(&engine.url()).await.unwrap();
    new.send(
        json!({"type": "reattach", "previous_worker_id": old.worker_id(),
                    "reattach_token": old.reattach_token()}),
    )
    .unwrap();
    new.register_function("re::f", None, None, None).unwrap();
    new.announce("phoenix", None).unwrap();
    assert!(
        old.next_message(WAIT).await.is_none(),
        "old connection closed"
    );
    let caller = Client::connect(&engine.url()).await.unwrap();
    let call = caller.invoke("re::f", json!({}), WAIT);
    let serve = async {
        let message = new
            .next_of_type("invokefunction", WAIT)
            .await
            .expect("call");
        let id = message["invocation_id"].as_str().unwrap();
        new.answer(id, "re::f", Ok(json!("new"))).unwrap();
    };
    let (result, ()) = tokio::join!(call, serve);
    assert_eq!(result.unwrap(), "new");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_pass_unchanged_and_fire_and_forget_gets_none() {
    let engine = engine().await;
    let (worker, caller) = worker_and_caller(&engine, "pass::f", "passer").await;

    // Sent by hand so the answer lands in the inbox whole.
    caller
        .send(json!({"type": "invokefunction", "invocation_id": "call-1",
                     "function_id": "pass::f", "data": [1, 2]}))
        .unwrap();
    let message = worker.next_of_type("invokefunction", WAIT).await.unwrap();
    assert_eq!(
        message["data"],
        json!([1, 2]),
        "non-object data is not stamped"
    );
    let error = json!({"code": "S404", "message": "{\"code\":\"S404\"}", "stacktrace": "at x"});
    worker
        .send(
            json!({"type": "invocationresult", "invocation_id": message["invocation_id"],
                     "function_id": "pass::f", "error": error, "traceparent": "00-1-2-01"}),
        )
        .unwrap();
    let answer = caller.next_of_type("invocationresult", WAIT).await.unwrap();
    assert_eq!(
        answer,
        json!({"type": "invocationresult", "invocation_id": "call-1", "function_id": "pass::f",
               "error": error, "traceparent": "00-1-2-01"})
    );

    caller
        .send(
            json!({"type": "invokefunction", "function_id": "pass::f", "data": {},
                     "action": {"type": "void"}}),
        )
        .unwrap();
    let message = worker.next_of_type("invokefunction", WAIT).await.unwrap();
    assert!(message.get("invocation_id").is_none());
    caller
        .send(json!({"type": "invokefunction", "function_id": "nope::x", "data": {}}))
        .unwrap();
    caller.send(json!({"type": "ping"})).unwrap();
    assert_eq!(
        caller.next_message(WAIT).await,
        Some(json!({"type": "pong"}))
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_crash_mid_call_gives_invocation_stopped() {
    let engine = engine().await;
    let (worker, caller) = worker_and_caller(&engine, "crash::f", "crasher").await;
    let call = caller.invoke("crash::f", json!({}), WAIT);
    let crash = async {
        worker
            .next_of_type("invokefunction", WAIT)
            .await
            .expect("call");
        worker.abort();
    };
    let (result, ()) = tokio::join!(call, crash);
    assert_eq!(result.unwrap_err().code, "invocation_stopped");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_socket_with_a_wrong_key_is_refused() {
    use tokio_tungstenite::tungstenite::Error;

    let engine = engine().await;
    let client = Client::connect(&engine.url()).await.unwrap();
    let refs = client
        .invoke("engine::channels::create", json!({}), WAIT)
        .await
        .unwrap();
    let id = refs["reader"]["channel_id"].as_str().unwrap();
    let writer_key = refs["writer"]["access_key"].as_str().unwrap();
    // The writer's key does not open the reader's end.
    let url = format!(
        "{}/ws/channels/{id}?key={writer_key}&dir=read",
        engine.url()
    );
    match tokio_tungstenite::connect_async(url).await {
        Err(Error::Http(response)) => assert_eq!(response.status(), 404),
        other => panic!("expected 404, got {:?}", other.map(|_| ())),
    }
    engine.shutdown().await;
}
