//! `fs::watch` through the engine on the bwrap plugin: events of a create, a write, a rename
//! and a delete in order; a burst of 100,000 events coalesced or overflow-flagged within
//! bounded memory of the agent and the adapter; the watch's end when the caller closes its
//! channel and when the sandbox stops; symbolic links never followed; bad paths S21x.

mod sandbox_support;

use std::sync::Arc;
use std::time::Duration;

use e2e_tests::{bwrap_usable, RemoteError, Stack};
use iii_sdk::channel::ChannelReader;
use sandbox_support::streams::{channel, channel_ref};
use sandbox_support::{agent_pid, create, exec_ok, expect_err, sh, status_kib, stop};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// Growth of the agent's resident memory a burst may cause at most: its queue holds 1 MiB of
/// events (paths counted twice, for coalescing), plus a 64 KiB read buffer and the batches
/// being encoded.
const AGENT_GROWTH_KIB: u64 = 8 * 1024;
/// The adapter's: at most 4 batches of 512 events in flight per watch, plus the channel's
/// socket buffers and allocator slack.
const ADAPTER_GROWTH_KIB: u64 = 32 * 1024;

/// The watch's NDJSON lines, read from the channel's read end by a task of their own (a read
/// cut short by a timeout would lose the channel's connection).
struct Lines {
    reader: Arc<ChannelReader>,
    frames: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
    /// Whether the task reads (a caller that stops reading is one that leaves it false).
    reading: tokio::sync::watch::Sender<bool>,
    pending: Vec<u8>,
}

impl Lines {
    fn new(stack: &Stack, read_end: &Value) -> Lines {
        let reader = Arc::new(ChannelReader::new(
            &stack.engine.url(),
            &channel_ref(read_end),
        ));
        let (tx, frames) = mpsc::unbounded_channel();
        let task_reader = reader.clone();
        let (reading, mut gate) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            loop {
                if gate.wait_for(|open| *open).await.is_err() {
                    return;
                }
                let frame = task_reader.next_binary().await.expect("the stream reads");
                let end = frame.is_none();
                if tx.send(frame).is_err() || end {
                    return;
                }
            }
        });
        Lines {
            reader,
            frames,
            task,
            reading,
            pending: Vec::new(),
        }
    }

    /// Stops or resumes taking frames from the channel.
    fn read(&self, on: bool) {
        self.reading.send_replace(on);
    }

    /// Closes the read end, as a caller that is done watching does.
    async fn close(self) {
        self.task.abort();
        let _ = self.task.await;
        self.reader.close().await.expect("close the read end");
    }

    /// The next line; `None` at the end of the stream, `Err` when nothing came in `wait`.
    async fn next_within(&mut self, wait: Duration) -> Result<Option<Value>, ()> {
        loop {
            if let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                let value = serde_json::from_slice(&line[..line.len() - 1])
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
                return Ok(Some(value));
            }
            let frame = tokio::time::timeout(wait, self.frames.recv())
                .await
                .map_err(|_| ())?
                .expect("the reading task is alive");
            match frame {
                Some(data) => self.pending.extend(data),
                None => {
                    assert!(self.pending.is_empty(), "a torn last line");
                    return Ok(None);
                }
            }
        }
    }

    async fn next(&mut self) -> Option<Value> {
        self.next_within(Duration::from_secs(60))
            .await
            .expect("a line within 60 s")
    }

    /// Lines until one matches `until` (included).
    async fn until(&mut self, until: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let line = self
                .next()
                .await
                .unwrap_or_else(|| panic!("the stream ended; saw {seen:?}"));
            let done = until(&line);
            seen.push(line);
            if done {
                return seen;
            }
        }
    }
}

type Watch = (
    tokio::task::JoinHandle<Result<Value, RemoteError>>,
    Lines,
    Value,
);

/// Starts `fs::watch` on a task of its own and waits for its `ready` line.
async fn start_watch(stack: &Arc<Stack>, id: &str, fields: Value) -> Watch {
    start_watch_buffered(stack, id, fields, None).await
}

/// [`start_watch`] on a channel whose engine buffer holds `buffer_size` messages.
async fn start_watch_buffered(
    stack: &Arc<Stack>,
    id: &str,
    fields: Value,
    buffer_size: Option<u64>,
) -> Watch {
    let (write_end, read_end) = match buffer_size {
        None => channel(stack).await,
        Some(size) => {
            let created = stack
                .client
                .invoke(
                    "engine::channels::create",
                    json!({"buffer_size": size}),
                    Duration::from_secs(10),
                )
                .await
                .expect("engine::channels::create");
            (created["writer"].clone(), created["reader"].clone())
        }
    };
    let mut payload = json!({"sandbox_id": id, "stream": write_end});
    if let (Some(base), Value::Object(fields)) = (payload.as_object_mut(), fields) {
        base.extend(fields);
    }
    let call_stack = stack.clone();
    let call = tokio::spawn(async move { call_stack.call("fs::watch", payload).await });
    let mut lines = Lines::new(stack, &read_end);
    let ready = lines.next().await.expect("a ready line");
    assert_eq!(ready["kind"], "ready", "{ready}");
    (call, lines, ready)
}

async fn reply(call: tokio::task::JoinHandle<Result<Value, RemoteError>>) -> Value {
    tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("fs::watch returns within 60 s")
        .expect("the task")
        .unwrap_or_else(|e| panic!("fs::watch failed: {e:?}"))
}

/// Create, write, rename, delete: the lines in that order, the rename paired; closing the
/// channel's read end ends the call.
#[tokio::test(flavor = "multi_thread")]
async fn create_write_rename_delete_arrive_in_order() {
    if !bwrap_usable("create_write_rename_delete_arrive_in_order") {
        return;
    }
    let stack = Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    exec_ok(&stack, &id, sh("mkdir -p /tmp/w/sub")).await;
    let (call, mut lines, ready) =
        start_watch(&stack, &id, json!({"path": "/tmp/w", "recursive": true})).await;
    assert_eq!(ready["watched"], 2, "{ready}");
    exec_ok(
        &stack,
        &id,
        sh("echo hi > /tmp/w/sub/a && mv /tmp/w/sub/a /tmp/w/sub/b && rm /tmp/w/sub/b"),
    )
    .await;
    let seen = lines
        .until(|l| l["kind"] == "deleted" && l["path"] == "/tmp/w/sub/b")
        .await;
    let shapes: Vec<(String, String)> = seen
        .iter()
        .map(|l| {
            (
                l["kind"].as_str().unwrap_or_default().to_string(),
                l["path"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let want = [
        ("created", "/tmp/w/sub/a"),
        ("modified", "/tmp/w/sub/a"),
        ("moved", "/tmp/w/sub/b"),
        ("deleted", "/tmp/w/sub/b"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(k, p)| (k.to_string(), p.to_string()))
        .collect();
    assert_eq!(shapes, want, "{seen:?}");
    assert_eq!(seen[2]["from"], "/tmp/w/sub/a");
    assert_eq!(seen[2]["to"], "/tmp/w/sub/b");
    assert!(seen.iter().all(|l| l["is_dir"] == false), "{seen:?}");
    // The caller closes its end: the call returns (once a heartbeat fails).
    let closed = std::time::Instant::now();
    lines.close().await;
    let answer = reply(call).await;
    eprintln!("the call returned {:?} after the close", closed.elapsed());
    assert_eq!(answer["ended"], "channel_closed", "{answer}");
    assert_eq!(answer["events"], 4, "{answer}");
    // The agent dropped the watch: eight new ones fit again (the limit is per sandbox).
    stop(&stack, &id, true).await;
}

/// What a run of lines held, until 3 s passed without one.
#[derive(Debug, Default)]
struct Counts {
    created: u64,
    modified: u64,
    overflows: u64,
}

async fn drain(lines: &mut Lines) -> Counts {
    let mut counts = Counts::default();
    loop {
        let line = match lines.next_within(Duration::from_secs(3)).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("the stream ended"),
            Err(()) => return counts, // quiet: the burst is through
        };
        match line["kind"].as_str() {
            Some("created") => counts.created += 1,
            Some("modified") => {
                assert_eq!(line["path"], "/tmp/burst/one", "{line}");
                counts.modified += 1
            }
            Some("overflow") => counts.overflows += 1,
            other => panic!("unexpected line {other:?}: {line}"),
        }
    }
}

/// 100,000 files created while the caller reads nothing (on a channel that buffers little,
/// names long enough that the socket buffers cannot hold them all): some events are lost and
/// overflow lines say so; then one file written 100,000 times while the caller reads: a few
/// coalesced `modified` lines. The agent's and the adapter's memory stay within their bounds.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_is_coalesced_or_overflow_flagged_in_bounded_memory() {
    if !bwrap_usable("a_burst_is_coalesced_or_overflow_flagged_in_bounded_memory") {
        return;
    }
    let stack = Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    exec_ok(&stack, &id, sh("mkdir -p /tmp/burst")).await;
    let agent = agent_pid(&stack, &id);
    let adapter = stack.adapter.pid();
    let (call, mut lines, _) =
        start_watch_buffered(&stack, &id, json!({"path": "/tmp/burst"}), Some(1)).await;
    let rss = |pid: u32| status_kib(pid, "VmRSS").expect("VmRSS");
    let (agent_before, adapter_before) = (rss(agent), rss(adapter));
    lines.read(false);
    let creates = "for i in range(100000):
    open('/tmp/burst/%s%d' % ('f' * 200, i), 'w').close()
";
    let started = std::time::Instant::now();
    exec_ok(&stack, &id, json!({"argv": ["python3", "-c", creates]})).await;
    let creates_secs = started.elapsed().as_secs_f64();
    let (agent_peak, adapter_peak) = (rss(agent), rss(adapter));
    lines.read(true);
    let first = drain(&mut lines).await;
    let writes = "with open('/tmp/burst/one', 'wb', buffering=0) as f:
    for i in range(100000):
        f.write(b'x')
";
    let started = std::time::Instant::now();
    exec_ok(&stack, &id, json!({"argv": ["python3", "-c", writes]})).await;
    let writes_secs = started.elapsed().as_secs_f64();
    let second = drain(&mut lines).await;
    let (agent_after, adapter_after) = (rss(agent), rss(adapter));
    eprintln!(
        "100000 creates in {creates_secs:.1} s, unread: {first:?}; 100000 writes in \
         {writes_secs:.1} s, read: {second:?}; agent RSS {agent_before} -> {agent_peak} -> \
         {agent_after} KiB, adapter RSS {adapter_before} -> {adapter_peak} -> \
         {adapter_after} KiB"
    );
    assert!(
        first.created == 100_000 || first.overflows > 0,
        "{first:?}: creates lost without an overflow line"
    );
    assert_eq!(second.created, 1, "{second:?}");
    assert!(
        second.modified >= 1 && second.modified < 1000,
        "{second:?}: 100000 writes not coalesced"
    );
    let agent_growth = agent_peak.max(agent_after).saturating_sub(agent_before);
    let adapter_growth = adapter_peak
        .max(adapter_after)
        .saturating_sub(adapter_before);
    assert!(
        agent_growth <= AGENT_GROWTH_KIB,
        "the agent grew {agent_growth} KiB"
    );
    assert!(
        adapter_growth <= ADAPTER_GROWTH_KIB,
        "the adapter grew {adapter_growth} KiB"
    );
    lines.close().await;
    assert_eq!(reply(call).await["ended"], "channel_closed");
}

/// Stopping the sandbox ends the watch: the channel closes and the call returns.
#[tokio::test(flavor = "multi_thread")]
async fn the_watch_ends_when_the_sandbox_stops() {
    if !bwrap_usable("the_watch_ends_when_the_sandbox_stops") {
        return;
    }
    let stack = Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    let (call, mut lines, _) =
        start_watch(&stack, &id, json!({"path": "/tmp", "recursive": true})).await;
    stop(&stack, &id, true).await;
    let mut rest = Vec::new();
    while let Some(line) = lines.next().await {
        rest.push(line);
    }
    let answer = reply(call).await;
    assert_eq!(answer["ended"], "sandbox_stopped", "{answer} {rest:?}");
}

/// Links to a host-looking path or out of the watched directory are never entered; the
/// watched path may not be a link (S212); missing S211, relative S210; a fifth watch S400.
#[tokio::test(flavor = "multi_thread")]
async fn links_are_not_followed_and_bad_paths_are_s_codes() {
    if !bwrap_usable("links_are_not_followed_and_bad_paths_are_s_codes") {
        return;
    }
    let stack = Arc::new(Stack::bwrap().await);
    let id = create(&stack, "python", json!({})).await;
    exec_ok(
        &stack,
        &id,
        sh(
            "mkdir -p /tmp/w /tmp/outside && ln -s /tmp/outside /tmp/w/out && \
            ln -s /etc /tmp/w/etc && ln -s /proc/1/root /tmp/w/root && ln -s /home /tmp/w/home",
        ),
    )
    .await;
    let (call, mut lines, ready) =
        start_watch(&stack, &id, json!({"path": "/tmp/w", "recursive": true})).await;
    assert_eq!(ready["watched"], 1, "no link entered: {ready}");
    exec_ok(
        &stack,
        &id,
        sh("touch /tmp/outside/secret /etc/watched-secret && touch /tmp/w/marker"),
    )
    .await;
    let seen = lines.until(|l| l["path"] == "/tmp/w/marker").await;
    assert!(
        seen.iter().all(|l| l["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/tmp/w/") && !p.contains("secret"))),
        "{seen:?}"
    );
    let call_fs = |fields: Value| {
        let stack = stack.clone();
        let id = id.clone();
        async move {
            let (write_end, _read_end) = channel(&stack).await;
            let mut payload = json!({"sandbox_id": id, "stream": write_end});
            if let (Some(base), Value::Object(fields)) = (payload.as_object_mut(), fields) {
                base.extend(fields);
            }
            stack.call("fs::watch", payload).await
        }
    };
    for (path, code) in [
        ("/tmp/w/out", "S212"),
        ("/tmp/w/etc", "S212"),
        ("/nope/at/all", "S211"),
        ("tmp/w", "S210"),
    ] {
        let (got, body) = expect_err(call_fs(json!({"path": path})).await, path);
        assert_eq!(got, code, "{path}: {body}");
    }
    let (got, _) = expect_err(
        call_fs(json!({"path": "/tmp/w", "max_dirs": 0})).await,
        "max_dirs 0",
    );
    assert_eq!(got, "S001");
    // Four watches per sandbox: this one and three more; a fifth is S400.
    let mut more = Vec::new();
    for _ in 0..3 {
        more.push(start_watch(&stack, &id, json!({"path": "/tmp"})).await);
    }
    let (got, body) = expect_err(call_fs(json!({"path": "/tmp"})).await, "a fifth watch");
    assert_eq!(got, "S400", "{body}");
    // Closed together: each call notices at its next heartbeat.
    let mut calls = Vec::new();
    for (call, lines, _) in more {
        lines.close().await;
        calls.push(call);
    }
    for call in calls {
        assert_eq!(reply(call).await["ended"], "channel_closed");
    }
    lines.close().await;
    assert_eq!(reply(call).await["ended"], "channel_closed");
}
