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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_reaches_a_raw_worker_with_caller_id_stamped() {
    let engine = engine().await;
    let worker = Client::connect(&engine.url()).await.unwrap();
    worker
        .register_function("raw::f", None, None, None)
        .unwrap();
    worker.announce("raw-worker", None).unwrap();
    let caller = Client::connect(&engine.url()).await.unwrap();
    caller
        .wait_for_function("raw::f", None, WAIT)
        .await
        .unwrap();
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
