//! Helpers shared by the worker VM tests (workers.rs on bwrap, libkrun.rs in the VM lab):
//! `worker::*` calls carrying the token, and the worker's log.

#![allow(dead_code)] // each test file uses its own subset

use std::path::Path;
use std::time::{Duration, Instant};

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

/// How many times [`worker_vm_rounds`] runs a round again after the lab's guest reset.
const ROUND_RERUNS: usize = 2;
/// How long it waits first, for a burst of resets to pass.
const ROUND_RERUN_PAUSE: Duration = Duration::from_secs(15);

/// The worker VM's whole life, `rounds` times in a row on one stack (workers.rs on bwrap,
/// libkrun.rs in the VM lab): a worker that connects back to the engine and registers a
/// function, called through the engine; `status`; the adapter killed with SIGKILL and started
/// again (`options`), which starts the worker again; in the first round, another port of the
/// host's loopback refused from a second start; `logs`; `stop` and `destroy`. `compose` is a
/// host root of the stack (the worker's `host_path`). Prints each round's time and the count
/// of rounds passed.
///
/// A round whose worker VM ended with the emulated lab's guest reset (see [`guest_reset`]), or
/// whose `start` failed because both of its boots did, is run again after a pause (the lab's
/// resets come in bursts: both boots of one create a second apart, then none for minutes), up
/// to [`ROUND_RERUNS`] times, saying so and counted in the last line; one more reset in the
/// same round fails the test.
pub async fn worker_vm_rounds(
    stack: &mut Stack,
    options: &AdapterOptions,
    compose: &Path,
    rounds: usize,
    backend: &str,
) {
    std::fs::write(compose.join("worker.py"), include_str!("../iii_worker.py")).unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    let all = Instant::now();
    let mut resets = 0;
    for round in 1..=rounds {
        let begun = Instant::now();
        let mut run = 0;
        let times = loop {
            match one_round(stack, options, compose, round, other_port).await {
                Ok(times) => break times,
                Err(reset) if run < ROUND_RERUNS => {
                    run += 1;
                    resets += 1;
                    println!(
                        "*** {backend} worker VM round {round}: the guest reset under the lab's \
                         emulation (no status from the guest), the round runs again in \
                         {ROUND_RERUN_PAUSE:?} (rerun {run} of at most {ROUND_RERUNS}): {reset} ***"
                    );
                    let _ = worker(stack, "destroy", json!({"vm_id": format!("w{round}")})).await;
                    tokio::time::sleep(ROUND_RERUN_PAUSE).await;
                }
                Err(again) => panic!("round {round}: a guest reset in its last run: {again}"),
            }
        };
        // Where a round's time goes, so a slow lab run says which step grew.
        println!(
            "*** {backend} worker VM round {round}/{rounds} passed in {:.1} s \
             (prepare to registered {:.1} s, adapter restart to registered again {:.1} s) ***",
            begun.elapsed().as_secs_f64(),
            times.first_boot.as_secs_f64(),
            times.restart.as_secs_f64()
        );
    }
    println!(
        "*** {backend} worker VMs: {rounds} of {rounds} rounds passed in a row, {:.1} s a round, \
         {resets} guest resets run again ***",
        all.elapsed().as_secs_f64() / rounds.max(1) as f64
    );
}

/// How long a round's two boots took, each up to the worker's registration.
struct RoundTimes {
    first_boot: Duration,
    restart: Duration,
}

/// One round of [`worker_vm_rounds`] with the worker VM `w<round>`; `Err` holds the evidence
/// when its VM ended with a guest reset instead of registering or answering.
async fn one_round(
    stack: &mut Stack,
    options: &AdapterOptions,
    compose: &Path,
    round: usize,
    other_port: u16,
) -> Result<RoundTimes, String> {
    let begun = Instant::now();
    let vm = format!("w{round}");
    let function = format!("{vm}::hello");
    let answer = format!("from-vm-{round}");
    worker_ok(
        stack,
        "prepare",
        json!({"vm_id": vm, "image": "python", "host_path": compose}),
    )
    .await;
    let started = start_unless_reset(
        stack,
        json!({"vm_id": vm,
               "command": ["python3", "/worker/worker.py", "serve", function, answer]}),
    )
    .await?;
    assert_eq!(started["state"], "running", "round {round}: {started}");
    wait_registered(stack, &vm, 1).await?;
    let first_boot = begun.elapsed();
    assert_eq!(
        answered_unless_reset(stack, &vm, &function).await?,
        json!({"answer": answer}),
        "round {round}: {}",
        stack.adapter.log()
    );
    let status = worker_ok(stack, "status", json!({"vm_id": vm})).await;
    assert_eq!(status["state"], "running", "round {round}: {status}");
    let old_pid = status["pid"].as_u64().expect("a running worker's pid");

    // Killed with the adapter, started again by the next adapter.
    stack.adapter.kill9();
    let gone = eventually(Duration::from_secs(20), || async {
        !Path::new(&format!("/proc/{old_pid}")).exists()
    })
    .await;
    assert!(gone, "round {round}: the worker VM outlived its adapter");
    let killed = Instant::now();
    stack.restart_adapter(options).await;
    wait_registered(stack, &vm, 2).await?;
    let restart = killed.elapsed();
    assert_eq!(
        answered_unless_reset(stack, &vm, &function).await?,
        json!({"answer": answer}),
        "round {round}, after the restart: {}",
        stack.adapter.log()
    );

    // Nothing else of the host's loopback: a probe from a second start of the VM (the
    // first round only: one boot less in each later one).
    if round == 1 {
        worker_ok(stack, "stop", json!({"vm_id": vm, "timeout_ms": 3000})).await;
        start_unless_reset(
            stack,
            json!({"vm_id": vm,
                   "command": ["python3", "/worker/worker.py", "probe", "127.0.0.1", other_port.to_string()]}),
        )
        .await?;
        let probe = format!("127.0.0.1:{other_port} ");
        let log = wait_log(stack, &vm, &probe, 1, Duration::from_secs(120)).await;
        let line = log.lines().find(|l| l.starts_with(&probe)).unwrap();
        assert!(
            !line.contains(" ok"),
            "round {round}: another loopback port was reached: {line}"
        );
    }
    let logs = worker_ok(stack, "logs", json!({"vm_id": vm})).await;
    assert!(
        logs.to_string().contains("registered"),
        "round {round}: logs keep the earlier runs: {logs}"
    );

    let stopped = worker_ok(stack, "stop", json!({"vm_id": vm, "timeout_ms": 3000})).await;
    // Round 1 ends on the probe, which may have exited by itself already.
    let expected: &[&str] = if round == 1 {
        &["stopped", "exited"]
    } else {
        &["stopped"]
    };
    assert!(
        expected.iter().any(|state| stopped["state"] == *state),
        "round {round}: {stopped}"
    );
    let destroyed = worker_ok(stack, "destroy", json!({"vm_id": vm})).await;
    assert_eq!(destroyed["destroyed"], true, "round {round}: {destroyed}");
    assert!(
        !stack.state_dir.path().join("workers").join(&vm).exists(),
        "round {round}: destroy deletes the worker's state"
    );
    Ok(RoundTimes {
        first_boot,
        restart,
    })
}

/// Whether a worker's `status` says its VM ended with the guest reset that the VM lab's
/// emulated nested virtualisation causes now and then (about one boot in 55 there, seen on a
/// bare runner boot with no worker code too): libkrun logged `KVM_EXIT_SHUTDOWN` and then the
/// vCPU's exit code, i.e. no status from the guest's init. The evidence, if so.
async fn guest_reset(stack: &Stack, vm_id: &str) -> Option<String> {
    let status = worker(stack, "status", json!({ "vm_id": vm_id }))
        .await
        .ok()?;
    let error = status["error"].as_str()?;
    (status["state"] == "failed" && is_guest_reset(error)).then(|| status.to_string())
}

/// `worker::start` that must succeed, unless it failed because both of its boots ended with
/// the lab's guest reset (the backend boots once more after one): then `Err` with the error.
async fn start_unless_reset(stack: &Stack, payload: Value) -> Result<Value, String> {
    let shown = payload.to_string();
    match worker(stack, "start", payload).await {
        Ok(started) => Ok(started),
        Err(e) if s_code(&e) == "S300" && is_guest_reset(&e.message) => Err(e.message),
        Err(e) => panic!("worker::start {shown}: {e:?}\n{}", stack.adapter.log()),
    }
}

/// libkrun's words for a vCPU that shut down with no status from the guest's init.
fn is_guest_reset(error: &str) -> bool {
    error.contains("Received KVM_EXIT_SHUTDOWN") && error.contains("using vcpu exit code")
}

/// Waits until the worker's log holds "registered" `times` times, as [`wait_log`] (which
/// panics if it never does), unless its VM ended with a guest reset first.
async fn wait_registered(stack: &Stack, vm_id: &str, times: usize) -> Result<(), String> {
    let within = Duration::from_secs(120);
    let found = eventually(within, || async {
        log_of(stack, vm_id).await.matches("registered").count() >= times
            || guest_reset(stack, vm_id).await.is_some()
    })
    .await;
    if let (true, Some(reset)) = (found, guest_reset(stack, vm_id).await) {
        return Err(reset);
    }
    wait_log(stack, vm_id, "registered", times, Duration::ZERO).await;
    Ok(())
}

/// [`call_until_answered`], unless the worker's VM ended with a guest reset first.
async fn answered_unless_reset(
    stack: &Stack,
    vm_id: &str,
    function: &str,
) -> Result<Value, String> {
    match tokio::time::timeout(
        Duration::from_secs(120),
        call_until_answered(stack, function),
    )
    .await
    {
        Ok(value) => Ok(value),
        Err(_) => match guest_reset(stack, vm_id).await {
            Some(reset) => Err(reset),
            None => panic!(
                "{function} never answered within 120 s: {}",
                stack.adapter.log()
            ),
        },
    }
}

/// Calls `function` through the engine until it answers (its worker registers
/// asynchronously); the last error is reported if it never does.
async fn call_until_answered(stack: &Stack, function: &str) -> Value {
    let mut last = String::new();
    for _ in 0..200 {
        match stack
            .client
            .invoke(function, json!({}), Duration::from_secs(10))
            .await
        {
            Ok(value) => return value,
            Err(e) => last = format!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{function} never answered: {last}");
}
