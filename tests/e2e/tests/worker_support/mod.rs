//! Helpers shared by the worker VM tests (workers.rs on bwrap, libkrun.rs in the VM lab):
//! `worker::*` calls carrying the token, and the worker's log.

#![allow(dead_code)] // each test file uses its own subset

use std::time::Duration;

use e2e_tests::{error_body, s_code, AdapterOptions, RemoteError, Stack};
use serde_json::{json, Value};

use crate::sandbox_support::eventually;

/// The token these tests give the adapter; long and unusual enough to find in any file.
pub const TOKEN: &str = "wk-tok-5f1e0c9a7b3d42e8a6c1-never-in-a-guest";

/// Adapter options for worker VMs of a Compose project at `dir`: the token, and `dir` as the
/// Compose directory (a host root).
pub fn compose_options(dir: &std::path::Path) -> AdapterOptions {
    AdapterOptions {
        env: vec![
            ("III_SANDBOX_WORKER_TOKEN".into(), TOKEN.into()),
            ("III_COMPOSE_DIR".into(), dir.display().to_string()),
        ],
        ..AdapterOptions::default()
    }
}

/// `worker::<op>` with the token in `auth`.
pub async fn worker(stack: &Stack, op: &str, mut payload: Value) -> Result<Value, RemoteError> {
    payload["auth"] = json!(TOKEN);
    stack.call(&format!("worker::{op}"), payload).await
}

/// `worker::<op>` that must succeed; panics with the adapter's log otherwise.
pub async fn worker_ok(stack: &Stack, op: &str, payload: Value) -> Value {
    let shown = payload.to_string();
    worker(stack, op, payload)
        .await
        .unwrap_or_else(|e| panic!("worker::{op} {shown}: {e:?}\n{}", stack.adapter.log()))
}

/// The S-code and message of a worker call that must fail.
pub async fn worker_err(stack: &Stack, op: &str, payload: Value) -> (String, String) {
    let shown = payload.to_string();
    match worker(stack, op, payload).await {
        Ok(answer) => panic!("worker::{op} {shown}: expected an error, got {answer}"),
        Err(e) => {
            let message = error_body(&e)["message"]
                .as_str()
                .unwrap_or(&e.message)
                .to_string();
            (s_code(&e), message)
        }
    }
}

/// The worker's log, through `worker::logs`.
pub async fn log_of(stack: &Stack, vm_id: &str) -> String {
    let logs = worker_ok(stack, "logs", json!({ "vm_id": vm_id })).await;
    logs["content"].as_str().expect("logs.content").to_string()
}

/// Waits up to `within` until the worker's log holds `needle` `times` times; the log as it
/// then was.
pub async fn wait_log(
    stack: &Stack,
    vm_id: &str,
    needle: &str,
    times: usize,
    within: Duration,
) -> String {
    let found = eventually(within, || async {
        log_of(stack, vm_id).await.matches(needle).count() >= times
    })
    .await;
    let log = log_of(stack, vm_id).await;
    assert!(
        found,
        "{needle:?} x{times} never showed in the log of {vm_id}: {log}\n{}",
        stack.adapter.log()
    );
    log
}
