//! `exec::cancel` through the engine on the bwrap plugin: a running exec is listed with its
//! `exec_id` (`list`'s `running_execs`, a streamed exec's first line), a cancel ends its
//! process group (SIGTERM, SIGKILL 2 s later for a program that ignores it), the exec
//! answers `cancelled: true` and its slot is free at once; bad ids and signals are S001.

mod sandbox_support;

use std::time::{Duration, Instant};

use e2e_tests::{bwrap_usable, AdapterOptions, Client, Stack};
use iii_sdk::channel::ChannelReader;
use sandbox_support::streams::{channel, channel_ref, exec_id_line};
use sandbox_support::{create, descendants, exec, exec_ok, expect_err, recorded_process, sh};
use serde_json::{json, Value};

/// Calls `exec` on a task of its own, so the test can cancel it meanwhile.
fn exec_in_background(
    stack: &std::sync::Arc<Stack>,
    id: &str,
    fields: Value,
) -> tokio::task::JoinHandle<Result<Value, e2e_tests::RemoteError>> {
    let stack = stack.clone();
    let id = id.to_string();
    tokio::spawn(async move { exec(&stack, &id, fields).await })
}

/// The running execs `list` shows for sandbox `id`.
async fn running_execs(stack: &Stack, id: &str) -> Vec<Value> {
    let listed = stack.call("list", json!({})).await.expect("list");
    listed["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .find(|s| s["sandbox_id"] == id)
        .map(|s| s["running_execs"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default()
}

/// Waits until sandbox `id` runs one exec of `argv0`; its `exec_id`.
async fn wait_for_exec(stack: &Stack, id: &str, argv0: &str) -> String {
    for _ in 0..200 {
        let execs = running_execs(stack, id).await;
        if let Some(found) = execs.iter().find(|e| e["argv0"] == argv0) {
            let mut keys: Vec<&String> = found.as_object().expect("an object").keys().collect();
            keys.sort();
            assert_eq!(keys, ["argv0", "exec_id", "started_at"], "{found}");
            return found["exec_id"].as_str().expect("exec_id").to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no running exec of {argv0} listed in {id}");
}

/// Host processes named `comm` in bwrap sandbox `id`.
fn in_sandbox(stack: &Stack, id: &str, comm: &str) -> usize {
    descendants(recorded_process(stack, id))
        .iter()
        .filter(|p| p.comm == comm)
        .count()
}

async fn cancel(stack: &Stack, id: &str, exec_id: &str, signal: Option<&str>) -> Value {
    let mut payload = json!({"sandbox_id": id, "exec_id": exec_id});
    if let Some(signal) = signal {
        payload["signal"] = signal.into();
    }
    stack
        .call("exec::cancel", payload)
        .await
        .unwrap_or_else(|e| panic!("exec::cancel: {e:?}\n{}", stack.adapter.log()))
}

/// A `sleep 300` cancelled: answered `cancelled: true` within a second, no sleep left in the
/// sandbox, and on a sandbox of one exec slot a new exec runs at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_sleep_answers_at_once_and_frees_its_slot() {
    if !bwrap_usable("a_cancelled_sleep_answers_at_once_and_frees_its_slot") {
        return;
    }
    let config = json!({"max_concurrent_exec_per_sandbox": 1});
    let stack = std::sync::Arc::new(Stack::start(config, AdapterOptions::default()).await);
    let id = create(&stack, "python", json!({})).await;
    let ok = exec_ok(&stack, &id, json!({"argv": ["true"]})).await;
    assert_eq!(ok["cancelled"], false, "{ok}");
    assert!(ok["exec_id"].is_string(), "{ok}");

    let call = exec_in_background(&stack, &id, json!({"argv": ["sleep", "300"]}));
    let exec_id = wait_for_exec(&stack, &id, "sleep").await;
    assert_eq!(in_sandbox(&stack, &id, "sleep"), 1);
    let (code, _) = expect_err(
        exec(&stack, &id, json!({"argv": ["true"]})).await,
        "a second exec on a one-slot sandbox",
    );
    assert_eq!(code, "S003");

    let asked = Instant::now();
    let answer = cancel(&stack, &id, &exec_id, None).await;
    assert_eq!(answer["cancelled"], true, "{answer}");
    let reply = call.await.expect("exec task").expect("the exec answers");
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(1), "answered after {took:?}");
    assert_eq!(reply["cancelled"], true, "{reply}");
    assert_eq!(reply["exec_id"], exec_id.as_str(), "{reply}");
    assert_eq!(reply["exit_code"], 128 + 15, "SIGTERM ended it: {reply}");
    assert_eq!(reply["timed_out"], false, "{reply}");
    println!("cancel to answer: {took:?}");

    // The slot is free at once: the next exec runs, and nothing of the sleep is left.
    let next = exec_ok(&stack, &id, json!({"argv": ["true"]})).await;
    assert_eq!(next["exit_code"], 0, "{next}");
    assert_eq!(next["cancelled"], false, "{next}");
    assert_eq!(in_sandbox(&stack, &id, "sleep"), 0, "a sleep is left");
    assert!(running_execs(&stack, &id).await.is_empty());

    // A cancel of the exec that has ended is S001, like an id never seen.
    let (code, body) = expect_err(
        stack
            .call(
                "exec::cancel",
                json!({"sandbox_id": id, "exec_id": exec_id}),
            )
            .await,
        "a cancel of an ended exec",
    );
    assert_eq!(code, "S001", "{body}");
}

/// A program that ignores SIGTERM is killed 2 s later; KILL needs no grace.
#[tokio::test(flavor = "multi_thread")]
async fn a_program_ignoring_term_is_killed_after_the_grace() {
    if !bwrap_usable("a_program_ignoring_term_is_killed_after_the_grace") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let stubborn = sh("trap '' TERM; while :; do sleep 0.2; done");
    let call = exec_in_background(&stack, &id, stubborn);
    let exec_id = wait_for_exec(&stack, &id, "/bin/sh").await;
    // Listed from before the spawn: give the shell time to set its trap.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    cancel(&stack, &id, &exec_id, Some("TERM")).await;
    let reply = call.await.expect("exec task").expect("the exec answers");
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(6),
        "SIGKILL 2 s after the ignored SIGTERM, answered after {took:?}: {reply}"
    );
    assert_eq!(reply["cancelled"], true, "{reply}");
    assert_eq!(reply["exit_code"], 128 + 9, "{reply}");

    let call = exec_in_background(&stack, &id, sh("trap '' TERM; sleep 300"));
    let exec_id = wait_for_exec(&stack, &id, "/bin/sh").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    cancel(&stack, &id, &exec_id, Some("SIGKILL")).await;
    let reply = call.await.expect("exec task").expect("the exec answers");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(reply["exit_code"], 128 + 9, "{reply}");
    assert_eq!(in_sandbox(&stack, &id, "sleep"), 0, "a sleep is left");
}

/// A streamed exec names its `exec_id` in its first line, before any output; cancelled
/// with INT, its exit line and its answer say `cancelled: true`.
#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_exec_names_its_id_first_and_can_be_cancelled() {
    if !bwrap_usable("a_streamed_exec_names_its_id_first_and_can_be_cancelled") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let (write_end, read_end) = channel(&stack).await;
    let reader = ChannelReader::new(&stack.engine.url(), &channel_ref(&read_end));
    let call = exec_in_background(
        &stack,
        &id,
        json!({"argv": ["sh", "-c", "sleep 300"], "stream": write_end}),
    );
    let mut pending = Vec::new();
    let mut lines = Vec::new();
    let first_frame = tokio::time::timeout(Duration::from_secs(30), reader.next_binary())
        .await
        .expect("the first line comes while the program runs")
        .expect("reads")
        .expect("not the end");
    pending.extend(first_frame);
    let at = pending
        .iter()
        .position(|b| *b == b'\n')
        .expect("a whole line");
    let exec_id = exec_id_line(&pending[..at]).expect("the first line is {\"exec_id\"}");
    pending.drain(..=at);
    assert_eq!(running_execs(&stack, &id).await[0]["exec_id"], exec_id);
    cancel(&stack, &id, &exec_id, Some("INT")).await;
    let reply = call.await.expect("exec task").expect("the exec answers");
    assert_eq!(reply["cancelled"], true, "{reply}");
    assert_eq!(reply["exit_code"], 128 + 2, "{reply}");
    while let Some(frame) = reader.next_binary().await.expect("reads") {
        pending.extend(frame);
    }
    for line in pending.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        lines.push(serde_json::from_slice::<Value>(line).expect("JSON line"));
    }
    let exit = lines.last().expect("an exit line");
    assert_eq!(exit["exit"]["cancelled"], true, "{exit}");
    assert_eq!(exit["exit"]["exec_id"], exec_id.as_str(), "{exit}");
}

/// A caller that goes away from its exec (its connection to the engine closed) leaves the
/// exec to its timeout; meanwhile `list` shows it and a cancel from anyone ends it.
#[tokio::test(flavor = "multi_thread")]
async fn an_abandoned_exec_is_listed_and_cancelled() {
    if !bwrap_usable("an_abandoned_exec_is_listed_and_cancelled") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let gone = Client::connect(&stack.engine.url()).await.expect("client");
    let payload = json!({"sandbox_id": id, "argv": ["sleep", "300"]});
    let call = tokio::spawn(async move {
        let _ = gone
            .invoke("sandbox-libkrun::exec", payload, Duration::from_millis(500))
            .await;
        // The caller gives up and its connection closes with it.
    });
    call.await.expect("the caller gave up");
    let exec_id = wait_for_exec(&stack, &id, "sleep").await;
    cancel(&stack, &id, &exec_id, None).await;
    let mut left = usize::MAX;
    for _ in 0..40 {
        left = in_sandbox(&stack, &id, "sleep");
        if left == 0 && running_execs(&stack, &id).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "the abandoned sleep is left");
}

/// Bad input is refused with an S-code and the adapter goes on serving.
#[tokio::test(flavor = "multi_thread")]
async fn bad_cancels_are_s_codes() {
    if !bwrap_usable("bad_cancels_are_s_codes") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let call = exec_in_background(&stack, &id, json!({"argv": ["sleep", "300"]}));
    let exec_id = wait_for_exec(&stack, &id, "sleep").await;
    let unknown = "00000000-0000-4000-8000-000000000000";
    let cases = [
        (json!({"sandbox_id": id, "exec_id": unknown}), "S001"),
        (json!({"sandbox_id": id, "exec_id": "not-a-uuid"}), "S001"),
        (json!({"sandbox_id": id}), "S001"),
        (
            json!({"sandbox_id": id, "exec_id": exec_id, "signal": "STOP"}),
            "S001",
        ),
        (
            json!({"sandbox_id": id, "exec_id": exec_id, "signal": 10}),
            "S001",
        ),
        (
            json!({"sandbox_id": id, "exec_id": exec_id, "signal": [15]}),
            "S001",
        ),
        (json!({"sandbox_id": unknown, "exec_id": exec_id}), "S002"),
    ];
    for (payload, want) in cases {
        let (code, body) = expect_err(
            stack.call("exec::cancel", payload.clone()).await,
            &payload.to_string(),
        );
        assert_eq!(code, want, "{payload}: {body}");
    }
    // None of those touched the sleep; a good cancel still ends it.
    assert_eq!(in_sandbox(&stack, &id, "sleep"), 1);
    cancel(&stack, &id, &exec_id, None).await;
    let reply = call.await.expect("exec task").expect("answers");
    assert_eq!(reply["cancelled"], true, "{reply}");
    let echo = exec_ok(&stack, &id, sh("echo still")).await;
    assert_eq!(echo["stdout"], "still\n", "{echo}");
}

/// Exec latency with the cancel bookkeeping: 200 sequential execs of `true` through the
/// engine (printed; the assertion is only a sanity bound).
#[tokio::test(flavor = "multi_thread")]
async fn exec_latency_of_true() {
    if !bwrap_usable("exec_latency_of_true") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    for _ in 0..20 {
        exec_ok(&stack, &id, json!({"argv": ["true"]})).await;
    }
    let mut took = Vec::with_capacity(200);
    for _ in 0..200 {
        let start = Instant::now();
        let reply = exec_ok(&stack, &id, json!({"argv": ["true"]})).await;
        took.push(start.elapsed());
        assert_eq!(reply["exit_code"], 0, "{reply}");
    }
    took.sort();
    let mean = took.iter().sum::<Duration>() / took.len() as u32;
    println!(
        "200 execs of true: median {:?}, mean {mean:?}, p90 {:?}",
        took[100], took[180]
    );
    assert!(mean < Duration::from_secs(1), "mean {mean:?}");
}
