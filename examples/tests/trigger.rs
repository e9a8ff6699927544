//! The `trigger` binary against the test engine: result on stdout, errors on stderr.

use std::net::SocketAddr;
use std::process::Output;
use std::time::Duration;

use iii_test_engine::client::Client;
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

async fn engine() -> EngineHandle {
    Engine::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("engine starts")
}

async fn trigger(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_trigger"))
        .args(args)
        .env_remove("III_URL")
        .output()
        .await
        .expect("trigger runs")
}

/// A raw worker serving `demo::add`: `{a, b}` -> `{sum}`, or an S-code style error.
async fn serve_add(url: &str) -> Client {
    let worker = Client::connect(url).await.expect("worker connects");
    worker
        .register_function("demo::add", None, None, None)
        .unwrap();
    worker.announce("adder", None).unwrap();
    let probe = Client::connect(url).await.expect("probe connects");
    probe
        .wait_for_function("demo::add", None, WAIT)
        .await
        .unwrap();
    worker
}

async fn answer_one(worker: &Client) {
    let call = worker
        .next_of_type("invokefunction", WAIT)
        .await
        .expect("a call arrives");
    let id = call["invocation_id"].as_str().unwrap();
    let data = &call["data"];
    let outcome = match (data["a"].as_i64(), data["b"].as_i64()) {
        (Some(a), Some(b)) => Ok(json!({"sum": a + b})),
        _ => Err(iii_test_engine::client::RemoteError::new(
            "S400",
            r#"{"code":"S400","message":"a and b must be integers"}"#,
        )),
    };
    worker.answer(id, "demo::add", outcome).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prints_the_result_as_pretty_json() {
    let engine = engine().await;
    let worker = serve_add(&engine.url()).await;
    let url = engine.url();
    let args = ["--url", &url, "demo::add", r#"{"a": 2, "b": 3}"#];
    let (output, ()) = tokio::join!(trigger(&args), answer_one(&worker));
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).unwrap(),
        json!({"sum": 5})
    );
    assert!(
        stdout.contains("\n  \"sum\": 5\n"),
        "not pretty: {stdout:?}"
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_errors_reach_stderr_unchanged_with_exit_1() {
    let engine = engine().await;
    let worker = serve_add(&engine.url()).await;
    let url = engine.url();
    let args = ["--url", &url, "demo::add", r#"{"a": "x"}"#];
    let (output, ()) = tokio::join!(trigger(&args), answer_one(&worker));
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim_end(),
        r#"error S400: {"code":"S400","message":"a and b must be integers"}"#
    );

    let output = trigger(&["--url", &url, "nope::missing"]).await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim_end(),
        "error function_not_found: Function nope::missing not found in namespace default."
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_engine_is_an_error_not_a_hang() {
    // Bind and drop to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{port}");
    let output = trigger(&["--url", &url, "--timeout-ms", "500", "demo::add"]).await;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error not_connected: "),
        "stderr: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_is_a_usage_error() {
    let output = trigger(&["--url", "ws://127.0.0.1:9", "demo::add", "{not json"]).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("error invalid_json: "));
}
