//! Terminals through the engine on the bwrap plugin: `exec` and `run` with `tty: {rows,
//! cols}` (and `stream`, `stdin_stream`) run the program on a pseudo-terminal of that size;
//! a text message `{"resize":{...}}` on `stdin_stream` resizes it; `python3 -i` answers at
//! it; a bad `tty` is S001 and the adapter serves on.

mod sandbox_support;

use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use iii_sdk::channel::ChannelWriter;
use sandbox_support::streams::{channel, channel_ref, Line, LineReader};
use sandbox_support::{create, exec, exec_ok, expect_err, stdout};
use serde_json::{json, Value};

/// One program on a terminal: the test's ends of its two channels and the call in flight.
struct Session {
    lines: LineReader,
    input: ChannelWriter,
    call: tokio::task::JoinHandle<Result<Value, e2e_tests::RemoteError>>,
    seen: String,
}

impl Session {
    /// Starts `fields` (with `tty` in it) as `suffix` (`exec` or `run`) with both channels.
    async fn start(stack: &std::sync::Arc<Stack>, suffix: &str, mut fields: Value) -> Session {
        let (out_write, out_read) = channel(stack).await;
        let (in_write, in_read) = channel(stack).await;
        fields["stream"] = out_write;
        fields["stdin_stream"] = in_read;
        let lines = LineReader::new(stack, &out_read);
        let input = ChannelWriter::new(&stack.engine.url(), &channel_ref(&in_write));
        let stack = stack.clone();
        let suffix = suffix.to_string();
        let call = tokio::spawn(async move { stack.call(&suffix, fields).await });
        Session {
            lines,
            input,
            call,
            seen: String::new(),
        }
    }

    /// Reads the stream until `want` shows up in what the terminal printed since the last
    /// call (every terminal byte is a `stdout` line).
    async fn expect(&mut self, want: &str) -> String {
        let read = async {
            while !self.seen.contains(want) {
                match self.lines.next().await {
                    Some(Line::Out(data)) => self.seen.push_str(&String::from_utf8_lossy(&data)),
                    Some(Line::Err(data)) => panic!("stderr on a terminal: {data:?}"),
                    other => panic!("ended before {want:?} (saw {:?}): {other:?}", self.seen),
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .is_err()
        {
            panic!("no {want:?} within 60 s; saw {:?}", self.seen);
        }
        let at = self.seen.find(want).unwrap_or(0) + want.len();
        let before = self.seen[..at].to_string();
        self.seen.drain(..at);
        before
    }

    async fn type_in(&self, text: &str) {
        self.input
            .write(text.as_bytes())
            .await
            .expect("write input");
    }

    async fn resize(&self, rows: u32, cols: u32) {
        let message = json!({"resize": {"rows": rows, "cols": cols}}).to_string();
        self.input
            .send_message(&message)
            .await
            .expect("send resize");
    }

    /// Reads to the exit line and returns it with the reply.
    async fn finish(mut self) -> (Value, Value) {
        let mut exit = None;
        while let Some(line) = self.lines.next().await {
            if let Line::Exit(e) = line {
                exit = Some(e);
            }
        }
        let reply = self.call.await.expect("call task").expect("call answers");
        (exit.expect("an exit line"), reply)
    }
}

/// `stty size` prints the size asked, `tty` a terminal, stderr comes through the terminal;
/// a resize message then `stty size` prints the new size; in a shell reading the terminal.
#[tokio::test(flavor = "multi_thread")]
async fn stty_and_tty_see_the_terminal_asked_and_a_resize_changes_it() {
    if !bwrap_usable("stty_and_tty_see_the_terminal_asked_and_a_resize_changes_it") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let mut session = Session::start(
        &stack,
        "exec",
        json!({
            "sandbox_id": id,
            "argv": ["sh"],
            "tty": {"rows": 37, "cols": 113},
            "timeout_ms": 60000,
        }),
    )
    .await;
    // A marker the echo of the typed command cannot contain: `$(...)` is only expanded by
    // the shell's run of it.
    session
        .type_in("stty size; tty; echo err-$((40+2)) >&2; echo done-$((1+1))\n")
        .await;
    let shown = session.expect("done-2\r\n").await;
    assert!(shown.contains("37 113\r\n"), "{shown:?}");
    assert!(shown.contains("\r\n/dev/pts/"), "{shown:?}");
    assert!(
        shown.contains("err-42\r\n"),
        "stderr through the terminal: {shown:?}"
    );

    session.resize(52, 140).await;
    session.type_in("stty size; echo done-$((2+1))\n").await;
    let shown = session.expect("done-3\r\n").await;
    assert!(shown.contains("52 140\r\n"), "{shown:?}");

    session.type_in("exit 3\n").await;
    let (exit, reply) = session.finish().await;
    assert_eq!(exit["exit_code"], 3, "{exit}");
    assert_eq!(exit["stderr_bytes"], 0, "{exit}");
    assert_eq!(reply["exit_code"], 3, "{reply}");
    assert_eq!(reply["stderr"], "", "{reply}");
    assert!(stdout(&reply).contains("52 140"), "{reply}");
    // The sandbox serves on.
    let after = exec_ok(&stack, &id, json!({"argv": ["echo", "alive"]})).await;
    assert_eq!(stdout(&after), "alive\n");
}

/// `python3 -i` at a terminal (no `-u`: a terminal makes it interactive and unbuffered on
/// its own) answers two inputs in turn, then exits.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_repl_at_a_terminal_answers_two_inputs() {
    if !bwrap_usable("a_python_repl_at_a_terminal_answers_two_inputs") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let mut session = Session::start(
        &stack,
        "exec",
        json!({
            "sandbox_id": id,
            "argv": ["python3", "-i"],
            "tty": {"rows": 24, "cols": 80},
            "timeout_ms": 60000,
        }),
    )
    .await;
    // Neither answer can be read in the echo of what was typed, whatever the REPL redraws.
    session.expect(">>> ").await;
    session.type_in("6*7\n").await;
    session.expect("42").await;
    session.type_in("print(\"x\"*3)\n").await;
    session.expect("xxx").await;
    session.type_in("exit()\n").await;
    let (exit, _reply) = session.finish().await;
    assert_eq!(exit["exit_code"], 0, "{exit}");
}

/// A program that cannot start on a terminal is exit code 127 as ever, and the agent's
/// message comes as terminal output like anything the program would have written to stderr.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_program_on_a_terminal_is_127_with_its_message_as_terminal_output() {
    if !bwrap_usable("a_missing_program_on_a_terminal_is_127_with_its_message_as_terminal_output") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let session = Session::start(
        &stack,
        "exec",
        json!({
            "sandbox_id": id,
            "argv": ["no-such-program"],
            "tty": {"rows": 24, "cols": 80},
        }),
    )
    .await;
    let (exit, reply) = session.finish().await;
    assert_eq!(exit["exit_code"], 127, "{exit}");
    assert_eq!(exit["stderr_bytes"], 0, "{exit}");
    assert!(stdout(&reply).contains("command not found"), "{reply}");
}

/// `run` takes `tty` too: the code runs at a terminal of the size asked.
#[tokio::test(flavor = "multi_thread")]
async fn run_takes_a_terminal_too() {
    if !bwrap_usable("run_takes_a_terminal_too") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let code = "import os, sys\nprint(os.isatty(0), os.isatty(1), os.get_terminal_size())\n";
    let session = Session::start(
        &stack,
        "run",
        json!({
            "image": "python",
            "lang": "python",
            "code": code,
            "tty": {"rows": 30, "cols": 90},
            "timeout_ms": 60000,
        }),
    )
    .await;
    let (exit, reply) = session.finish().await;
    assert_eq!(exit["exit_code"], 0, "{exit}");
    assert_eq!(
        stdout(&reply),
        "True True os.terminal_size(columns=90, lines=30)\r\n",
        "{reply}"
    );
}

/// A `tty` out of range, malformed, or without both channels is S001, before anything
/// runs; the adapter and the sandbox serve on.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_tty_is_s001_and_the_adapter_serves_on() {
    if !bwrap_usable("a_bad_tty_is_s001_and_the_adapter_serves_on") {
        return;
    }
    let stack = std::sync::Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let (out_write, _out_read) = channel(&stack).await;
    let (_in_write, in_read) = channel(&stack).await;
    let both = |tty: Value| json!({"argv": ["true"], "tty": tty, "stream": out_write, "stdin_stream": in_read});
    let cases = [
        ("rows 0", both(json!({"rows": 0, "cols": 80}))),
        ("cols 1001", both(json!({"rows": 24, "cols": 1001}))),
        ("no cols", both(json!({"rows": 24}))),
        ("a string", both(json!("24x80"))),
        (
            "without stdin_stream",
            json!({"argv": ["true"], "tty": {"rows": 24, "cols": 80}, "stream": out_write}),
        ),
        (
            "without either channel",
            json!({"argv": ["true"], "tty": {"rows": 24, "cols": 80}}),
        ),
    ];
    for (what, fields) in cases {
        let (code, body) = expect_err(exec(&stack, &id, fields).await, what);
        assert_eq!(code, "S001", "{what}: {body}");
    }
    let (code, body) = expect_err(
        stack
            .call(
                "run",
                json!({"image": "python", "lang": "python", "code": "pass", "tty": {"rows": 0, "cols": 80}}),
            )
            .await,
        "run with rows 0",
    );
    assert_eq!(code, "S001", "{body}");
    // Nothing changed for the requests that do not name `tty`.
    let after = exec_ok(
        &stack,
        &id,
        json!({"argv": ["sh", "-c", "test -t 0 || echo no-tty"]}),
    )
    .await;
    assert_eq!(stdout(&after), "no-tty\n");
}
