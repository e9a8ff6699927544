//! Streamed exec through the engine on the bwrap plugin: `exec`'s `stream` (the
//! write end of a channel the test made) carries the output as NDJSON while the program runs,
//! then the exit line; `stdin_stream` drives an interactive program; a reader that stops
//! reading blocks the program, not the adapter's memory; a broken stream is S218.

mod sandbox_support;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use iii_sdk::channel::{ChannelReader, ChannelWriter};
use sandbox_support::streams::{channel, channel_ref, Line, LineReader};
use sandbox_support::{create, exec, exec_ok, expect_err, sh, status_kib, stdout};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const MIB: usize = 1024 * 1024;

fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum on the host");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(data)
        .expect("feed sha256sum");
    let out = child.wait_with_output().expect("sha256sum ends");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Calls `exec` on a task of its own, so the test can read the stream meanwhile.
fn exec_in_background(
    stack: &std::sync::Arc<Stack>,
    id: &str,
    fields: Value,
) -> tokio::task::JoinHandle<Result<Value, e2e_tests::RemoteError>> {
    let stack = stack.clone();
    let id = id.to_string();
    tokio::spawn(async move { exec(&stack, &id, fields).await })
}

#[derive(Debug, PartialEq)]
enum Event {
    Chunk(Vec<u8>),
    ExitLine,
    Reply,
}

/// A line every 100 ms for 2 s: the first reaches the reader before the program ends (before
/// the exit line and before the reply), every line in order, the exit line last.
#[tokio::test(flavor = "multi_thread")]
async fn output_arrives_while_the_program_runs() {
    if !bwrap_usable("output_arrives_while_the_program_runs") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let (write_end, read_end) = channel(&stack).await;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut lines = LineReader::new(&stack, &read_end);
    let stream_events = events_tx.clone();
    let reading = tokio::spawn(async move {
        while let Some(line) = lines.next().await {
            let event = match line {
                Line::Out(data) => Event::Chunk(data),
                Line::Err(data) => panic!("stderr {data:?}"),
                Line::Exit(exit) => {
                    assert_eq!(exit["exit_code"], 0, "{exit}");
                    assert_eq!(exit["success"], true, "{exit}");
                    assert_eq!(exit["timed_out"], false, "{exit}");
                    let all: usize = (0..20).map(|i| format!("line{i}\n").len()).sum();
                    assert_eq!(exit["stdout_bytes"], all, "{exit}");
                    assert!(exit.get("stdout").is_none(), "{exit}");
                    Event::ExitLine
                }
            };
            stream_events.send(event).expect("events");
        }
    });
    let fields = json!({
        "argv": ["/bin/sh", "-c", "i=0; while [ $i -lt 20 ]; do echo line$i; i=$((i+1)); sleep 0.1; done"],
        "stream": write_end,
    });
    let call = exec_in_background(&stack, &id, fields);
    let reply = call.await.expect("exec task").expect("exec answers");
    events_tx.send(Event::Reply).expect("events");
    reading.await.expect("the stream reads to its end");
    drop(events_tx);
    let mut seen = Vec::new();
    while let Some(event) = events.recv().await {
        seen.push(event);
    }
    let first = seen.iter().position(|e| matches!(e, Event::Chunk(_)));
    let exit_line = seen.iter().position(|e| *e == Event::ExitLine);
    let replied = seen.iter().position(|e| *e == Event::Reply);
    assert!(
        first.is_some() && first < exit_line && exit_line < replied,
        "first chunk, exit line, reply: {seen:?}"
    );
    // 20 lines over 2 s come as several chunks, not one at the end.
    let chunks = seen.iter().filter(|e| matches!(e, Event::Chunk(_))).count();
    assert!(chunks > 1, "one chunk only: {seen:?}");
    let streamed: Vec<u8> = seen
        .iter()
        .filter_map(|e| match e {
            Event::Chunk(d) => Some(d.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let expected: String = (0..20).map(|i| format!("line{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&streamed), expected);
    // The reply is the usual exec response.
    assert_eq!(stdout(&reply), expected);
    assert_eq!(reply["exit_code"], 0);
    assert_eq!(reply["stdout_truncated"], false);
}

/// 50 MiB through the stream arrives whole (same sha256 as the file in the sandbox) while the
/// reply holds the first 1 MiB with the truncated flag.
#[tokio::test(flavor = "multi_thread")]
async fn fifty_mib_arrive_whole_while_the_reply_holds_one() {
    if !bwrap_usable("fifty_mib_arrive_whole_while_the_reply_holds_one") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let made = exec_ok(
        &stack,
        &id,
        sh("head -c 52428800 /dev/urandom > /tmp/big && sha256sum /tmp/big"),
    )
    .await;
    let digest = stdout(&made)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(digest.len(), 64, "{made}");

    let (write_end, read_end) = channel(&stack).await;
    let mut lines = LineReader::new(&stack, &read_end);
    let call = exec_in_background(
        &stack,
        &id,
        json!({"argv": ["cat", "/tmp/big"], "stream": write_end}),
    );
    let mut streamed = Vec::with_capacity(50 * MIB);
    let mut exit = None;
    while let Some(line) = lines.next().await {
        match line {
            Line::Out(data) => streamed.extend(data),
            Line::Err(data) => panic!("stderr {}", String::from_utf8_lossy(&data)),
            Line::Exit(e) => exit = Some(e),
        }
    }
    let reply = call.await.expect("exec task").expect("exec answers");
    assert_eq!(streamed.len(), 50 * MIB);
    assert_eq!(
        sha256(&streamed),
        digest,
        "the stream carried the file unchanged"
    );
    let exit = exit.expect("an exit line");
    assert_eq!(exit["stdout_bytes"], 50 * MIB, "{exit}");
    // The exit line's flags are the stream's (nothing lost), the reply's its copies'.
    assert_eq!(exit["stdout_truncated"], false, "{exit}");
    // The reply's copy is the first 1 MiB (as text: the bytes are random).
    assert_eq!(stdout(&reply), String::from_utf8_lossy(&streamed[..MIB]));
    assert_eq!(reply["stdout_truncated"], true);
    assert_eq!(reply["exit_code"], 0);
}

/// How many processes named `name` run in the sandbox (from its /proc).
async fn running(stack: &Stack, id: &str, name: &str) -> usize {
    let script = format!(
        "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -cx {name} || true"
    );
    let out = exec_ok(stack, id, sh(&script)).await;
    stdout(&out).trim().parse().unwrap_or(0)
}

/// A reader that stops reading while the program tries to write 200 MiB: the adapter's RSS
/// stays within 64 MiB of what it was, the program stays alive and blocked (the exec does
/// not answer), other calls to the sandbox still work; reading again lets it finish whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_reader_blocks_the_program_not_the_adapter_memory() {
    if !bwrap_usable("a_stalled_reader_blocks_the_program_not_the_adapter_memory") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let adapter = stack.adapter.pid();
    let id = create(&stack, "python", json!({})).await;
    let before = status_kib(adapter, "VmRSS").expect("adapter VmRSS");

    let (write_end, read_end) = channel(&stack).await;
    let mut lines = LineReader::new(&stack, &read_end);
    let call = exec_in_background(
        &stack,
        &id,
        json!({"argv": ["head", "-c", "209715200", "/dev/zero"], "stream": write_end}),
    );
    let mut received = 0usize;
    match lines.next().await {
        Some(Line::Out(data)) => received += data.len(),
        other => panic!("expected output first, got {other:?}"),
    }
    // Stop reading. The program blocks once the window, the channel and the pipes are full.
    let mut peak = before;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(status_kib(adapter, "VmRSS").expect("adapter VmRSS"));
    }
    assert!(
        peak < before + 64 * 1024,
        "adapter RSS grew from {before} KiB to {peak} KiB with a stalled reader"
    );
    assert!(
        !call.is_finished(),
        "the exec answered while its reader stalled"
    );
    assert_eq!(
        running(&stack, &id, "head").await,
        1,
        "the program is alive (blocked), not killed"
    );
    let rss_stalled = status_kib(adapter, "VmRSS").expect("adapter VmRSS");
    assert!(
        rss_stalled < before + 64 * 1024,
        "{before} -> {rss_stalled} KiB"
    );

    // Reading again: the rest comes, whole.
    let mut exit = None;
    while let Some(line) = lines.next().await {
        match line {
            Line::Out(data) => received += data.len(),
            Line::Err(data) => panic!("stderr {}", String::from_utf8_lossy(&data)),
            Line::Exit(e) => exit = Some(e),
        }
    }
    assert_eq!(received, 200 * MIB);
    let exit = exit.expect("an exit line");
    assert_eq!(exit["exit_code"], 0, "{exit}");
    let reply = call.await.expect("exec task").expect("exec answers");
    assert_eq!(reply["exit_code"], 0);
    assert_eq!(reply["stdout_truncated"], true);
    println!("adapter VmRSS {before} KiB before, {peak} KiB peak while stalled");
}

/// `python3 -i` driven through `stdin_stream`: each input's answer is read from the stream
/// before the next input is written; closing the channel ends the interpreter.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_repl_answers_two_inputs_in_turn() {
    if !bwrap_usable("a_python_repl_answers_two_inputs_in_turn") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let (out_write, out_read) = channel(&stack).await;
    let (in_write, in_read) = channel(&stack).await;
    let mut lines = LineReader::new(&stack, &out_read);
    let input = ChannelWriter::new(&stack.engine.url(), &channel_ref(&in_write));
    let call = exec_in_background(
        &stack,
        &id,
        json!({
            "argv": ["python3", "-i", "-u"],
            "stream": out_write,
            "stdin_stream": in_read,
            "timeout_ms": 60000,
        }),
    );
    for (code, answer) in [
        ("print(6 * 7)\n", "42\n"),
        ("print('ab' * 3)\n", "ababab\n"),
    ] {
        input.write(code.as_bytes()).await.expect("write input");
        let mut out = Vec::new();
        while !String::from_utf8_lossy(&out).contains(answer) {
            match lines.next().await {
                Some(Line::Out(data)) => out.extend(data),
                // The prompts and the banner go to stderr.
                Some(Line::Err(_)) => {}
                other => panic!("the REPL ended before answering {code:?}: {other:?}"),
            }
        }
        assert_eq!(String::from_utf8_lossy(&out), answer);
    }
    input.close().await.expect("close stdin");
    let mut exit = None;
    while let Some(line) = lines.next().await {
        if let Line::Exit(e) = line {
            exit = Some(e);
        }
    }
    let exit = exit.expect("an exit line");
    assert_eq!(exit["exit_code"], 0, "{exit}");
    let reply = call.await.expect("exec task").expect("exec answers");
    assert_eq!(stdout(&reply), "42\nababab\n");
}

/// A reader that goes away mid-output: S218 with what was streamed so far, the program
/// killed, the sandbox serving on. Malformed refs are S001.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_stream_is_s218_and_bad_refs_are_s001() {
    if !bwrap_usable("a_broken_stream_is_s218_and_bad_refs_are_s001") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let (write_end, read_end) = channel(&stack).await;
    let mut lines = LineReader::new(&stack, &read_end);
    let call = exec_in_background(
        &stack,
        &id,
        json!({"argv": ["sh", "-c", "exec yes streamed"], "stream": write_end}),
    );
    let mut received = 0;
    while received < 4 * MIB {
        match lines.next().await {
            Some(Line::Out(data)) => received += data.len(),
            other => panic!("expected output, got {other:?}"),
        }
    }
    drop(lines); // the reader goes away mid-output
    let (code, body) = expect_err(
        tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("the exec answers once its stream broke")
            .expect("exec task"),
        "a broken stream",
    );
    assert_eq!(code, "S218", "{body}");
    assert_eq!(body["retryable"], true, "{body}");
    let fix = &body["fix"];
    let sent = fix["stream_sent"]["stdout_bytes"]
        .as_u64()
        .expect("stream_sent");
    assert!(sent as usize >= received, "{fix}");
    assert!(
        fix["stdout"]
            .as_str()
            .is_some_and(|s| s.starts_with("streamed\n")),
        "{fix}"
    );
    assert_eq!(
        running(&stack, &id, "yes").await,
        0,
        "the program was killed"
    );

    let (write_end, read_end) = channel(&stack).await;
    for (fields, what) in [
        (json!({"stream": read_end}), "a read end as stream"),
        (
            json!({"stdin_stream": write_end}),
            "a write end as stdin_stream",
        ),
        (json!({"stream": "nope"}), "a string"),
        (json!({"stream": {"channel_id": 5}}), "a malformed ref"),
        (
            json!({"stdin": "eA==", "stdin_stream": read_end}),
            "stdin and stdin_stream",
        ),
    ] {
        let mut fields = fields;
        fields["argv"] = json!(["true"]);
        let (code, body) = expect_err(exec(&stack, &id, fields).await, what);
        assert_eq!(code, "S001", "{what}: {body}");
    }
    // A channel nobody can open: S218 before anything runs.
    let nowhere = json!({"channel_id": "no-such-channel", "access_key": "k", "direction": "write"});
    let (code, body) = expect_err(
        exec(&stack, &id, json!({"argv": ["true"], "stream": nowhere})).await,
        "a channel nobody can open",
    );
    assert_eq!(code, "S218", "{body}");
    let still = exec_ok(&stack, &id, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(stdout(&still), "ok\n");
}

/// `run` streams the same way: the code's output, then the exit line, then the reply.
#[tokio::test(flavor = "multi_thread")]
async fn run_streams_its_output_too() {
    if !bwrap_usable("run_streams_its_output_too") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let (write_end, read_end) = channel(&stack).await;
    let mut lines = LineReader::new(&stack, &read_end);
    let call = {
        let stack = stack.clone();
        tokio::spawn(async move {
            let payload = json!({
                "image": "python",
                "lang": "python",
                "code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n",
                "stream": write_end,
            });
            stack.call("run", payload).await
        })
    };
    let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), None);
    while let Some(line) = lines.next().await {
        match line {
            Line::Out(d) => out.extend(d),
            Line::Err(d) => err.extend(d),
            Line::Exit(e) => exit = Some(e),
        }
    }
    assert_eq!(String::from_utf8_lossy(&out), "out\n");
    assert_eq!(String::from_utf8_lossy(&err), "err\n");
    assert_eq!(exit.expect("an exit line")["exit_code"], 0);
    let reply = call.await.expect("run task").expect("run answers");
    assert_eq!(stdout(&reply), "out\n");
    assert_eq!(reply["stderr"], "err\n");
}

/// A reader that never reads and a deadline: the program is killed at `timeout_ms`, the
/// adapter gives the reader its 30 s to take the rest, then closes the stream without an exit
/// line and answers S200 as usual.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_reader_and_a_deadline_end_in_s200() {
    if !bwrap_usable("a_stalled_reader_and_a_deadline_end_in_s200") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let (write_end, read_end) = channel(&stack).await;
    let reader = ChannelReader::new(&stack.engine.url(), &channel_ref(&read_end));
    let call = exec_in_background(
        &stack,
        &id,
        json!({"argv": ["sh", "-c", "exec yes"], "stream": write_end, "timeout_ms": 2000}),
    );
    let (code, body) = expect_err(
        tokio::time::timeout(Duration::from_secs(90), call)
            .await
            .expect("the exec answers after its deadline and the drain time")
            .expect("exec task"),
        "a stalled reader past the deadline",
    );
    assert_eq!(code, "S200", "{body}");
    assert_eq!(body["fix"]["timed_out"], true, "{body}");
    assert_eq!(
        running(&stack, &id, "yes").await,
        0,
        "killed at the deadline"
    );
    // What the channel held comes, then its end, with no exit line.
    let mut streamed = Vec::new();
    while let Some(frame) = reader.next_binary().await.expect("the stream reads") {
        streamed.extend(frame);
    }
    assert!(!streamed.is_empty());
    let text = String::from_utf8_lossy(&streamed);
    assert!(
        !text.contains("\"exit\""),
        "an exit line after a given-up stream"
    );
}
