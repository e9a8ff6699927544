//! Helpers shared by the integration tests: SDK workers with explicit identities, polling.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use iii_sdk::protocol::TriggerRequest;
use iii_sdk::runtime::WorkerMetadata;
use iii_sdk::{register_worker, Error, IIIClient, InitOptions, WorkerIdentityMode};
use serde_json::Value;

pub const WAIT: Duration = Duration::from_secs(20);

/// An SDK worker named `name`; explicit identity, so `III_WORKER_NAME` in the environment
/// cannot change the test.
pub fn sdk_worker(url: &str, name: &str, namespace: Option<&str>) -> IIIClient {
    let metadata = WorkerMetadata {
        name: name.to_string(),
        namespace: namespace.map(str::to_string),
        ..WorkerMetadata::default()
    };
    register_worker(
        url,
        InitOptions {
            metadata: Some(metadata),
            namespace: namespace.map(str::to_string),
            identity: WorkerIdentityMode::Explicit,
            ..InitOptions::default()
        },
    )
}

pub async fn call(iii: &IIIClient, function_id: &str, payload: Value) -> Result<Value, Error> {
    iii.trigger(TriggerRequest {
        function_id: function_id.to_string(),
        payload,
        action: None,
        timeout_ms: Some(5_000),
    })
    .await
}

/// Retries `attempt` every 50 ms until it gives `Some`, or panics after `WAIT`.
pub async fn eventually<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `function_id` answers `caller` with a result.
pub async fn until_callable(caller: &IIIClient, function_id: &str, payload: Value) -> Value {
    eventually(function_id, || async {
        call(caller, function_id, payload.clone()).await.ok()
    })
    .await
}

pub fn remote_code(error: &Error) -> Option<(&str, &str)> {
    match error {
        Error::Remote { code, message, .. } => Some((code.as_str(), message.as_str())),
        _ => None,
    }
}
