//! Streamed exec: `exec`/`run` with `stream` (the write end of a caller's engine
//! channel) get the program's output as it arrives, as NDJSON lines
//! `{"stream":"stdout"|"stderr","data_b64":...}` and a last `{"exit":{...}}`; with
//! `stdin_stream` (the read end of one) the program's stdin is fed as the caller writes.
//!
//! With `tty: {rows, cols}` (and both channels) the program runs on a pseudo-terminal of
//! that size: its output (stdout and stderr merged by the terminal) comes as `stdout`
//! lines, the binary messages of `stdin_stream` are typed at the terminal, and a text
//! message `{"resize":{"rows":R,"cols":C}}` on `stdin_stream` resizes it. Input is only
//! ever binary messages, so no input can be taken for a resize.
//!
//! Memory: the exec runs with an agent flow window ([`WINDOW`]): the agent stops reading the
//! program's pipes while a window's worth is not yet written into the channel, so a caller
//! that stops reading blocks the program (until its `timeout_ms`), never the adapter's memory
//! or the sandbox's other calls. The reply keeps its own copies, 1 MiB per stream as always.

use agent_proto::client::{FlowHandle, OutputChunk};
use agent_proto::{ExecExit, ExecOutcome, ExecSpec, TtySize};
use base64::Engine as _;
use iii_sdk::channel::{ChannelReader, ChannelWriter, StreamChannelRef};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::error::{FsCode, SandboxError};
use crate::ops::cancel::ExecTicket;
use crate::ops::exec::{agent_failure, ended_by_stop, result_json, OUTPUT_CAP};
use crate::registry::Sandbox;

/// Output (agent to adapter) and stdin (adapter to agent) in flight per streamed exec, in
/// the agent protocol's cost units (bytes plus 64 per chunk).
pub const WINDOW: u64 = 1024 * 1024;

/// Once the program has ended, how long the caller has to take the rest of the stream (the
/// lines in flight and the exit line) before it is given up (S218, or S200 when the exec
/// timed out).
pub const DRAIN_STALL: Duration = Duration::from_secs(30);

/// The caller's channel ends for one exec.
#[derive(Debug, Default)]
pub struct StreamRefs {
    pub output: Option<StreamChannelRef>,
    pub stdin: Option<StreamChannelRef>,
    /// Run on a pseudo-terminal of this size (only with both channels).
    pub tty: Option<TtySize>,
}

impl StreamRefs {
    /// `stream` and `stdin_stream` as the request gave them (absent or null: none).
    pub fn parse(stream: Option<Value>, stdin_stream: Option<Value>) -> Result<Self, SandboxError> {
        Ok(StreamRefs {
            output: stream
                .map(|v| channel_ref("stream", v, "write"))
                .transpose()?,
            stdin: stdin_stream
                .map(|v| channel_ref("stdin_stream", v, "read"))
                .transpose()?,
            tty: None,
        })
    }

    pub fn any(&self) -> bool {
        self.output.is_some() || self.stdin.is_some()
    }
}

/// Largest `rows` and `cols` of a `tty` (a terminal's size is 16-bit; nothing real is
/// near this).
pub const TTY_MAX: u16 = 1000;

/// `tty` as the request gave it (absent or null: none). S001 unless it is `{rows, cols}`,
/// each 1 to [`TTY_MAX`], given with both `stream` and `stdin_stream`.
pub fn tty(value: Option<Value>, refs: &StreamRefs) -> Result<Option<TtySize>, SandboxError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if refs.output.is_none() || refs.stdin.is_none() {
        return Err(SandboxError::InvalidRequest(
            "`tty` needs `stream` and `stdin_stream`: a terminal's output and input are \
             streamed"
                .into(),
        ));
    }
    let bad = || {
        SandboxError::InvalidRequest(format!(
            "`tty` must be {{\"rows\": R, \"cols\": C}} with R and C from 1 to {TTY_MAX}"
        ))
    };
    let fields = value.as_object().ok_or_else(bad)?;
    if fields.keys().any(|k| k != "rows" && k != "cols") {
        return Err(bad());
    }
    let cells = |name: &str| {
        fields
            .get(name)
            .and_then(Value::as_u64)
            .filter(|n| (1..=u64::from(TTY_MAX)).contains(n))
            .map(|n| n as u16)
            .ok_or_else(bad)
    };
    Ok(Some(TtySize {
        rows: cells("rows")?,
        cols: cells("cols")?,
    }))
}

/// The request schema of `tty`.
pub fn tty_schema() -> Value {
    let cells = json!({"type": "integer", "minimum": 1, "maximum": TTY_MAX});
    let mut schema = crate::functions::object(
        &["rows", "cols"],
        json!({"rows": cells.clone(), "cols": cells}),
    );
    schema["additionalProperties"] = false.into();
    schema["description"] = "Run on a pseudo-terminal of this size (needs `stream` and \
        `stdin_stream`): the program's own session with the terminal as its controlling \
        one; stdout and stderr merged as `stdout` lines; a text message \
        {\"resize\":{\"rows\":R,\"cols\":C}} on `stdin_stream` resizes it"
        .into();
    schema
}

/// A text message on `stdin_stream`: `{"resize": {"rows": R, "cols": C}}` gives the size;
/// anything else is None (ignored, like a key no terminal has).
fn resize_message(text: &str) -> Option<TtySize> {
    let value: Value = serde_json::from_str(text).ok()?;
    let size = value.get("resize")?;
    let cells = |name: &str| {
        size.get(name)
            .and_then(Value::as_u64)
            .filter(|n| (1..=u64::from(TTY_MAX)).contains(n))
            .map(|n| n as u16)
    };
    Some(TtySize {
        rows: cells("rows")?,
        cols: cells("cols")?,
    })
}

/// The request schema of `stream` (`"write"`) and `stdin_stream` (`"read"`).
pub fn schema(direction: &str) -> Value {
    let description = if direction == "write" {
        "Write end of a channel from engine::channels::create: the output as NDJSON lines \
         {\"stream\":\"stdout\"|\"stderr\",\"data_b64\"} as it arrives, then {\"exit\":{...}}"
    } else {
        "Read end of a channel from engine::channels::create: fed to the program's stdin as \
         it arrives; closing it closes stdin"
    };
    let mut schema = crate::functions::object(
        &["channel_id", "access_key", "direction"],
        json!({
            "channel_id": {"type": "string"},
            "access_key": {"type": "string"},
            "direction": {"type": "string", "enum": [direction]},
        }),
    );
    schema["description"] = description.into();
    schema
}

fn channel_ref(
    field: &str,
    value: Value,
    direction: &str,
) -> Result<StreamChannelRef, SandboxError> {
    let what = if direction == "write" {
        "the write end of a channel the caller reads"
    } else {
        "the read end of a channel the caller writes"
    };
    if !value.is_object() {
        return Err(SandboxError::InvalidRequest(format!(
            "`{field}` must be {what}, an object {{channel_id, access_key, direction}}"
        )));
    }
    let channel: StreamChannelRef = serde_json::from_value(value).map_err(|e| {
        SandboxError::InvalidRequest(format!(
            "`{field}` must be {what} {{channel_id, access_key, direction}}: {e}"
        ))
    })?;
    let given = serde_json::to_value(&channel.direction).unwrap_or(Value::Null);
    if given != direction {
        return Err(SandboxError::InvalidRequest(format!(
            "`{field}` must be {what} (direction \"{direction}\"), got {given}"
        )));
    }
    Ok(channel)
}

/// S218: the stream broke; `partial` is the exec response so far, if the program ran.
fn aborted(message: String, partial: Option<Value>) -> SandboxError {
    SandboxError::Fs {
        code: FsCode::StreamAborted,
        message,
        fix: partial.map(|partial| {
            (
                partial,
                "the exec response until the stream broke (the program was killed then); \
                 `stream_sent` counts the bytes written into the stream"
                    .into(),
            )
        }),
    }
}

/// The reply's copies of the output (the head of each stream, up to 1 MiB).
#[derive(Default)]
struct Copies {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_cut: bool,
    stderr_cut: bool,
}

impl Copies {
    fn add(&mut self, chunk: &OutputChunk) {
        let (buf, cut, data) = match chunk {
            OutputChunk::Stdout(d) => (&mut self.stdout, &mut self.stdout_cut, d),
            OutputChunk::Stderr(d) => (&mut self.stderr, &mut self.stderr_cut, d),
        };
        let room = OUTPUT_CAP.saturating_sub(buf.len());
        *cut |= data.len() > room;
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    fn outcome(self, exit: &ExecExit) -> ExecOutcome {
        ExecOutcome {
            stdout: self.stdout,
            stderr: self.stderr,
            stdout_truncated: self.stdout_cut || exit.stdout_truncated,
            stderr_truncated: self.stderr_cut || exit.stderr_truncated,
            exit_code: exit.exit_code,
            timed_out: exit.timed_out,
            duration_ms: exit.duration_ms,
        }
    }
}

/// What went into the caller's stream.
#[derive(Default, Clone, Copy)]
struct Sent {
    stdout: u64,
    stderr: u64,
}

/// Why the stream (either direction) failed, and whether the program had ended by then.
struct Broken {
    why: String,
    after_end: bool,
}

/// Runs `spec` in `sandbox` with the caller's channels; the caller holds the exec slot. The
/// stream's first line is `{"exec_id": ...}` (for `exec::cancel`); each signal received on
/// `signals` goes to the program's process group.
pub async fn run(
    engine_url: &str,
    sandbox: &Sandbox,
    mut spec: ExecSpec,
    refs: StreamRefs,
    ticket: &ExecTicket<'_>,
    mut signals: mpsc::UnboundedReceiver<i32>,
) -> Result<Value, SandboxError> {
    let writer = refs
        .output
        .as_ref()
        .map(|r| ChannelWriter::new(engine_url, r));
    if let Some(writer) = &writer {
        // Attach before the program starts: a ref nobody can open fails with nothing run.
        writer
            .write(&[])
            .await
            .map_err(|e| aborted(format!("cannot open the `stream` channel: {e}"), None))?;
        let mut first =
            serde_json::to_vec(&json!({"exec_id": ticket.id.to_string()})).unwrap_or_default();
        first.push(b'\n');
        writer.write(&first).await.map_err(|e| {
            aborted(
                format!("writing into the `stream` channel failed: {e}"),
                None,
            )
        })?;
    }
    // The stream carries everything; the reply's copies are cut here.
    spec.max_output_bytes = usize::MAX;
    spec.tty = refs.tty;
    let timeout_ms = spec.timeout_ms;
    let flow = match sandbox
        .agent
        .exec_flow(&spec, refs.stdin.is_some(), WINDOW)
        .await
    {
        Ok(flow) => flow,
        Err(agent_proto::AgentError::Unsupported(why)) => {
            return Err(SandboxError::Unsupported(format!(
                "streamed exec in sandbox {}: {why}; a sandbox created by this adapter has it",
                sandbox.id
            )))
        }
        Err(e) => return Err(agent_failure(sandbox, e).await),
    };
    let (ended_tx, ended) = watch::channel(None::<Instant>);
    let stdin_broken = std::sync::Arc::new(std::sync::Mutex::new(None::<Broken>));
    let feeder = refs.stdin.as_ref().map(|r| {
        let reader = ChannelReader::new(engine_url, r);
        tokio::spawn(feed_stdin(
            reader,
            flow.handle.clone(),
            ended.clone(),
            stdin_broken.clone(),
            refs.tty,
        ))
    });
    let signaller = flow.handle.clone();
    let _signaller = AbortOnDrop(Some(tokio::spawn(async move {
        while let Some(signal) = signals.recv().await {
            signaller.signal(signal).await;
        }
    })));
    let handle = flow.handle.clone();
    let mut output = flow.output;
    let pump = async {
        let mut copies = Copies::default();
        let mut sent = Sent::default();
        let mut broken: Option<Broken> = None;
        let mut ended = ended.clone();
        while let Some(chunk) = output.recv().await {
            copies.add(&chunk);
            let (data, name) = match &chunk {
                OutputChunk::Stdout(d) => (d, "stdout"),
                OutputChunk::Stderr(d) => (d, "stderr"),
            };
            if let (Some(writer), None) = (&writer, &broken) {
                let line = json!({
                    "stream": name,
                    "data_b64": base64::engine::general_purpose::STANDARD.encode(data),
                });
                match write_line(writer, &line, &mut ended).await {
                    Ok(()) => match chunk {
                        OutputChunk::Stdout(_) => sent.stdout += data.len() as u64,
                        OutputChunk::Stderr(_) => sent.stderr += data.len() as u64,
                    },
                    Err(why) => {
                        broken = Some(Broken {
                            why,
                            after_end: ended.borrow().is_some(),
                        });
                        // Nobody takes the output any more: end the program.
                        handle.kill().await;
                    }
                }
            }
            // Consumed either way (written on, or dropped past a break): the agent reads on.
            let _ = handle.consumed(data.len()).await;
        }
        (copies, sent, broken, ended)
    };
    let exit = async {
        let exit = flow.exit.wait().await;
        let _ = ended_tx.send(Some(Instant::now()));
        exit
    };
    let ((copies, sent, mut broken, mut ended), exit) = tokio::join!(pump, exit);
    if let Some(feeder) = feeder {
        feeder.abort();
    }
    let exit = match exit {
        Ok(exit) => exit,
        Err(e) => return Err(agent_failure(sandbox, e).await),
    };
    if let Some(stopped) = ended_by_stop(sandbox, exit.exit_code).await {
        return Err(stopped);
    }
    let outcome = copies.outcome(&exit);
    let mut result = result_json(&outcome);
    if let (Some(writer), None) = (&writer, &broken) {
        let mut last = result.clone();
        if let Some(fields) = last.as_object_mut() {
            // The lines above carried the output itself.
            fields.remove("stdout");
            fields.remove("stderr");
            fields.insert("stdout_bytes".into(), sent.stdout.into());
            fields.insert("stderr_bytes".into(), sent.stderr.into());
            // Here the flags are the stream's: output the agent dropped (only once the
            // program was being killed), not the reply's 1 MiB cut.
            fields.insert("stdout_truncated".into(), exit.stdout_truncated.into());
            fields.insert("stderr_truncated".into(), exit.stderr_truncated.into());
            fields.insert("exec_id".into(), ticket.id.to_string().into());
            fields.insert("cancelled".into(), ticket.cancelled().into());
        }
        let closed = match write_line(writer, &json!({ "exit": last }), &mut ended).await {
            Ok(()) => writer.close().await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        if let Err(why) = closed {
            broken = Some(Broken {
                why,
                after_end: true,
            });
        }
    }
    let stdin_broken = stdin_broken
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    result["stream_sent"] = json!({"stdout_bytes": sent.stdout, "stderr_bytes": sent.stderr});
    // A deadline that passed first is the cause; a stream that broke while the program ran
    // (and so killed it) is.
    let cause = broken
        .map(|b| (b, "stream"))
        .or(stdin_broken.map(|b| (b, "stdin_stream")));
    match cause {
        Some((b, field)) if !(outcome.timed_out && b.after_end) => Err(aborted(
            format!(
                "the `{field}` channel broke after {} bytes of stdout and {} of stderr were \
                 streamed: {}",
                sent.stdout, sent.stderr, b.why
            ),
            Some(result),
        )),
        _ if outcome.timed_out => {
            result.as_object_mut().map(|o| o.remove("stream_sent"));
            Err(SandboxError::ExecTimedOut {
                timeout_ms,
                partial: result,
            })
        }
        _ => {
            result.as_object_mut().map(|o| o.remove("stream_sent"));
            Ok(result)
        }
    }
}

/// Writes one NDJSON line. While the program runs it waits as long as the caller needs (the
/// exec's deadline bounds that); once it has ended, until [`DRAIN_STALL`] after the end.
async fn write_line(
    writer: &ChannelWriter,
    line: &Value,
    ended: &mut watch::Receiver<Option<Instant>>,
) -> Result<(), String> {
    let mut bytes = serde_json::to_vec(line).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    let write = writer.write(&bytes);
    tokio::pin!(write);
    let stall = async {
        let end = match ended.wait_for(Option::is_some).await {
            Ok(end) => end.unwrap_or_else(Instant::now),
            Err(_) => Instant::now(), // the exec's side is gone: it has ended
        };
        tokio::time::sleep_until(end + DRAIN_STALL).await;
    };
    tokio::select! {
        written = &mut write => written.map_err(|e| format!("writing into it failed: {e}")),
        () = stall => Err(format!(
            "the reader took nothing for {} s after the program ended",
            DRAIN_STALL.as_secs()
        )),
    }
}

/// Feeds the caller's `stdin_stream` to the program; its end closes the program's stdin.
/// A channel that fails kills the program (S218). Aborted once the exec has ended.
///
/// On a terminal (`tty`) its text messages are resizes: each is taken as it arrives (the
/// reader hands text to a callback while it waits for binary data) and sent before any
/// input that followed it on the channel.
async fn feed_stdin(
    reader: ChannelReader,
    handle: FlowHandle,
    ended: watch::Receiver<Option<Instant>>,
    broken: std::sync::Arc<std::sync::Mutex<Option<Broken>>>,
    tty: Option<TtySize>,
) {
    // Only the latest size matters: a burst of resizes is one.
    let (sizes, mut latest) = watch::channel(tty);
    let mut resizer = None;
    if tty.is_some() {
        reader
            .on_message(move |text| {
                if let Some(size) = resize_message(&text) {
                    sizes.send_replace(Some(size));
                }
            })
            .await;
        latest.mark_unchanged();
        let mut changes = latest.clone();
        let handle = handle.clone();
        resizer = Some(tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let size = *changes.borrow_and_update();
                if let Some(size) = size {
                    if handle.resize(size).await.is_err() {
                        return;
                    }
                }
            }
        }));
    }
    let _resizer = AbortOnDrop(resizer);
    loop {
        let next = reader.next_binary().await;
        // A resize that came before this input goes first (sent twice at worst, which
        // changes nothing: the terminal signals only a size that differs).
        if latest.has_changed().unwrap_or(false) {
            let size = *latest.borrow_and_update();
            if let Some(size) = size {
                let _ = handle.resize(size).await;
            }
        }
        match next {
            Ok(Some(data)) => match handle.stdin(&data).await {
                Ok(true) => {}
                // The exec ended, or its link did (the exit says which).
                Ok(false) | Err(_) => return,
            },
            Ok(None) => {
                let _ = handle.close_stdin().await;
                return;
            }
            Err(e) => {
                *broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(Broken {
                    why: format!("reading it failed: {e}"),
                    after_end: ended.borrow().is_some(),
                });
                handle.kill().await;
                return;
            }
        }
    }
}

/// Aborts the task when the feeder ends (it is aborted itself once the exec has ended).
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tty_is_rows_and_cols_in_range_with_both_channels() {
        let end = |dir: &str| json!({"channel_id": "c", "access_key": "k", "direction": dir});
        let both = StreamRefs::parse(Some(end("write")), Some(end("read"))).unwrap();
        let size = tty(Some(json!({"rows": 24, "cols": 1000})), &both).unwrap();
        assert_eq!(
            size,
            Some(TtySize {
                rows: 24,
                cols: 1000
            })
        );
        assert_eq!(tty(None, &both).unwrap(), None);
        assert_eq!(tty(Some(Value::Null), &both).unwrap(), None);
        let bad = [
            json!({"rows": 0, "cols": 80}),
            json!({"rows": 24, "cols": 1001}),
            json!({"rows": 24}),
            json!({"rows": -1, "cols": 80}),
            json!({"rows": 24.5, "cols": 80}),
            json!({"rows": "24", "cols": 80}),
            json!({"rows": 24, "cols": 80, "row": 1}),
            json!([24, 80]),
            json!(true),
        ];
        for value in bad {
            let error = tty(Some(value.clone()), &both).expect_err(&value.to_string());
            assert_eq!(error.code(), "S001", "{value}");
        }
        let output_only = StreamRefs::parse(Some(end("write")), None).unwrap();
        let stdin_only = StreamRefs::parse(None, Some(end("read"))).unwrap();
        for refs in [output_only, stdin_only, StreamRefs::default()] {
            let error = tty(Some(json!({"rows": 24, "cols": 80})), &refs).unwrap_err();
            assert_eq!(error.code(), "S001");
        }
    }

    #[test]
    fn only_a_resize_object_is_a_resize() {
        let size = resize_message(r#"{"resize":{"rows":50,"cols":132}}"#);
        assert_eq!(
            size,
            Some(TtySize {
                rows: 50,
                cols: 132
            })
        );
        for text in [
            "",
            "ls\n",
            r#"{"resize":{"rows":0,"cols":80}}"#,
            r#"{"resize":{"rows":24}}"#,
            r#"{"rows":24,"cols":80}"#,
            r#"["resize"]"#,
        ] {
            assert_eq!(resize_message(text), None, "{text}");
        }
    }

    #[test]
    fn only_well_formed_ends_of_the_right_direction_are_accepted() {
        let end = |dir: &str| json!({"channel_id": "c", "access_key": "k", "direction": dir});
        let ok = StreamRefs::parse(Some(end("write")), Some(end("read"))).unwrap();
        assert!(ok.output.is_some() && ok.stdin.is_some());
        assert!(!StreamRefs::parse(None, None).unwrap().any());
        let bad = [
            (Some(end("read")), None),
            (None, Some(end("write"))),
            (Some(json!("c")), None),
            (Some(json!({"channel_id": "c"})), None),
            (None, Some(json!([1]))),
        ];
        for (stream, stdin) in bad {
            let what = format!("{stream:?} {stdin:?}");
            let error = StreamRefs::parse(stream, stdin).expect_err(&what);
            assert_eq!(error.code(), "S001", "{what}");
        }
    }

    #[test]
    fn the_reply_copies_keep_the_head_of_each_stream() {
        let mut copies = Copies::default();
        copies.add(&OutputChunk::Stdout(vec![b'a'; OUTPUT_CAP - 1]));
        copies.add(&OutputChunk::Stdout(b"bc".to_vec()));
        copies.add(&OutputChunk::Stderr(b"e".to_vec()));
        let exit = ExecExit {
            exit_code: 0,
            signal: None,
            timed_out: false,
            killed: false,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_total: 0,
            stderr_total: 0,
            duration_ms: 1,
        };
        let outcome = copies.outcome(&exit);
        assert_eq!(outcome.stdout.len(), OUTPUT_CAP);
        assert_eq!(outcome.stdout.last(), Some(&b'b'));
        assert!(outcome.stdout_truncated && !outcome.stderr_truncated);
        assert_eq!(outcome.stderr, b"e");
    }
}
