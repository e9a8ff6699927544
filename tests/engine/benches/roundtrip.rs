//! Round-trip cost of a call through the test engine, against a ping to the engine as the
//! baseline (same process, same run). Prints a table; asserts nothing.
//!
//! `cargo bench -p iii-test-engine --bench roundtrip` (set `ROUNDTRIP_N` to change the count).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use iii_sdk::protocol::TriggerRequest;
use iii_sdk::runtime::WorkerMetadata;
use iii_sdk::{register_worker, InitOptions, RegisterFunction, WorkerIdentityMode};
use iii_test_engine::client::Client;
use iii_test_engine::Engine;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn sdk(url: &str, name: &str) -> iii_sdk::IIIClient {
    let metadata = WorkerMetadata {
        name: name.into(),
        ..WorkerMetadata::default()
    };
    register_worker(
        url,
        InitOptions {
            metadata: Some(metadata),
            identity: WorkerIdentityMode::Explicit,
            ..InitOptions::default()
        },
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("ROUNDTRIP_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let engine = Engine::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("engine starts");
    let url = engine.url();

    // Raw worker answering every call at once.
    let worker = Client::connect(&url).await.unwrap();
    worker
        .register_function("bench::raw", None, None, None)
        .unwrap();
    worker.announce("bench-raw", None).unwrap();
    let server = tokio::spawn(async move {
        while let Some(call) = worker.next_of_type("invokefunction", Duration::MAX).await {
            let id = call["invocation_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let _ = worker.answer(&id, "bench::raw", Ok(call["data"].clone()));
        }
    });
    let caller = Client::connect(&url).await.unwrap();
    caller
        .wait_for_function("bench::raw", None, WAIT)
        .await
        .unwrap();

    let mut ping = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        caller.send(json!({"type": "ping"})).unwrap();
        caller.next_of_type("pong", WAIT).await.expect("pong");
        ping.push(start.elapsed());
    }
    let mut builtin = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        caller
            .invoke(
                "engine::functions::info",
                json!({"function_id": "bench::raw"}),
                WAIT,
            )
            .await
            .unwrap();
        builtin.push(start.elapsed());
    }
    let mut raw = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        caller
            .invoke("bench::raw", json!({"i": i}), WAIT)
            .await
            .unwrap();
        raw.push(start.elapsed());
    }

    let sdk_server = sdk(&url, "bench-sdk-server");
    sdk_server.register_function(
        "bench::sdk",
        RegisterFunction::new_async(|input: Value| async move { Ok(input) }),
    );
    let sdk_caller = sdk(&url, "bench-sdk-caller");
    caller
        .wait_for_function("bench::sdk", None, WAIT)
        .await
        .unwrap();
    let mut through_sdk = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        sdk_caller
            .trigger(TriggerRequest::new("bench::sdk", json!({"i": i})))
            .await
            .unwrap();
        through_sdk.push(start.elapsed());
    }

    let base = median(ping.clone());
    println!("round trips through iii-test-engine, n = {n}, median");
    println!("{:<44} {:>12} {:>8}", "path", "median", "ratio");
    for (name, samples) in [
        ("ping -> pong (baseline)", ping),
        ("built-in engine::functions::info", builtin),
        ("raw client -> engine -> raw worker", raw),
        ("iii-sdk trigger -> engine -> iii-sdk worker", through_sdk),
    ] {
        let m = median(samples);
        let ratio = m.as_secs_f64() / base.as_secs_f64();
        println!("{name:<44} {:>10.1}us {ratio:>7.2}x", m.as_secs_f64() * 1e6);
    }
    sdk_server.shutdown_async().await;
    sdk_caller.shutdown_async().await;
    server.abort();
    engine.shutdown().await;
}
