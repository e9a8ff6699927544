//! `fs::watch`: what changes under a path of the sandbox, as NDJSON lines into the write end
//! of the caller's engine channel (`stream`), until the caller closes the channel or the
//! sandbox stops. The agent watches with inotify (`agent_proto::watch`); every event it sends
//! is checked here and written anew (guest names are hostile): its path must be relative,
//! without `.`/`..` or empty components, within [`MAX_EVENT_PATH`] bytes, and comes out
//! joined to the watched path. An event that fails is not passed on; an `overflow` line takes
//! its place.
//!
//! Lines: first `{"kind":"ready","path":P,"watched":N}` (the watch is in place, N directories
//! or the one file), then `{"path","kind":"created"|"modified"|"deleted"|"moved","is_dir"}`
//! (`moved` with `from` and `to` when both names were seen), `{"kind":"overflow"}` where
//! events were lost, `{"kind":"limit","code":"S400","message"}` when the watch reached its
//! directory limit. The reply: `{"ended":"channel_closed"|"sandbox_stopped","events",
//! "overflows","limit"}`.
//!
//! Memory: the agent sends at most `WATCH_WINDOW` batches ahead of what was written into the
//! channel (each at most 512 events in one frame), and coalesces and drops in its own bounded
//! queue meanwhile, so a caller that reads slowly costs events (overflow), never memory here.
//! A watch does not keep its sandbox from the idle timeout: events are not activity.

use std::sync::Arc;
use std::time::Duration;

use agent_proto::client::{WatchItem, WatchStream};
use agent_proto::watch::MAX_EVENT_PATH;
use agent_proto::{AgentError, ErrorCode, WatchEvent, WatchKind, WatchRequest, MAX_WATCH_DIRS};
use iii_sdk::channel::ChannelWriter;
use serde::Deserialize;
use serde_json::{json, Value};

use super::channel::{aborted, STALL_TIMEOUT};
use super::{begin, guest_path};
use crate::backend::Backend;
use crate::error::SandboxError;
use crate::ops::exec::agent_failure;
use crate::plugin::SandboxPlugin;
use crate::request::parse;

/// How often an idle watch checks that the caller's channel is still open (a text message,
/// which readers of binary data never see).
const HEARTBEAT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
struct Request {
    sandbox_id: String,
    path: String,
    #[serde(default)]
    recursive: bool,
    stream: Value,
    max_dirs: Option<u32>,
}

pub async fn watch<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: Request = parse(payload)?;
    guest_path("path", &request.path)?;
    let max_dirs = request.max_dirs.unwrap_or(MAX_WATCH_DIRS);
    if !(1..=MAX_WATCH_DIRS).contains(&max_dirs) {
        return Err(SandboxError::InvalidRequest(format!(
            "`max_dirs` must be 1 to {MAX_WATCH_DIRS}"
        )));
    }
    if request.path.len() > MAX_EVENT_PATH {
        return Err(SandboxError::InvalidRequest(format!(
            "`path` is longer than {MAX_EVENT_PATH} bytes"
        )));
    }
    let refs = crate::ops::stream::StreamRefs::parse(Some(request.stream), None)?;
    let Some(output) = refs.output else {
        return Err(SandboxError::InvalidRequest(
            "`stream` must be the write end of a channel".into(),
        ));
    };
    let engine_url = plugin.host.engine_url().ok_or_else(|| {
        SandboxError::Unsupported(
            "`stream` needs the engine connection of the shell, and this plugin runs without one"
                .into(),
        )
    })?;
    let (sandbox, call) = begin(plugin, &request.sandbox_id).await?;
    let writer = ChannelWriter::new(&engine_url, &output);
    // Attach first: a ref nobody can open fails before anything is watched.
    writer
        .write(&[])
        .await
        .map_err(|e| aborted(format!("cannot open the `stream` channel: {e}")))?;
    let watch = WatchRequest {
        path: request.path.clone(),
        recursive: request.recursive,
        max_dirs,
    };
    let (mut stream, watched) = match sandbox.agent.watch(watch).await {
        Ok(started) => started,
        Err(AgentError::Unsupported(why)) => {
            return Err(SandboxError::Unsupported(format!(
                "fs::watch in sandbox {}: {why}; a sandbox created by this adapter has it",
                sandbox.id
            )));
        }
        Err(AgentError::Request(refusal)) if refusal.code == ErrorCode::Busy => {
            return Err(SandboxError::ResourceLimit(format!(
                "fs::watch in sandbox {}: {}; end one first (close its channel)",
                sandbox.id, refusal.message
            )));
        }
        Err(e) => return Err(agent_failure(&sandbox, e).await),
    };
    // In place: from here on the watch is no call that holds the sandbox from its timeout.
    drop(call);
    let mut lines = Lines::new(&request.path);
    let ready = json!({"kind": "ready", "path": request.path, "watched": watched});
    let mut ended = match send(&writer, &[ready]).await {
        Ok(()) => pump(&writer, &mut stream, &mut lines).await,
        Err(_) => Ok("channel_closed"),
    };
    if !matches!(ended, Ok("channel_closed")) {
        // The last lines are in; the caller's reader sees the end.
        let _ = writer.close().await;
    }
    if let Err(SandboxError::Fs { message, .. }) = &mut ended {
        message.push_str(&format!(
            " ({} events and {} overflows were streamed)",
            lines.events, lines.overflows
        ));
    }
    let how = ended?;
    // Dropping the stream stops the watch in the agent if it still runs.
    drop(stream);
    Ok(json!({
        "ended": how,
        "events": lines.events,
        "overflows": lines.overflows,
        "limit": lines.limit,
    }))
}

/// Passes batches on until the watch ends: how it ended, or the error that ended it.
async fn pump(
    writer: &ChannelWriter,
    stream: &mut WatchStream,
    lines: &mut Lines,
) -> Result<&'static str, SandboxError> {
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.tick().await;
    loop {
        let item = tokio::select! {
            item = stream.recv() => item,
            _ = heartbeat.tick() => {
                if writer.send_message("heartbeat").await.is_err() {
                    return Ok("channel_closed");
                }
                continue;
            }
        };
        match item {
            Some(WatchItem::Batch(batch)) => {
                let out: Vec<Value> = batch.events.iter().map(|e| lines.line(e)).collect();
                if send(writer, &out).await.is_err() {
                    return Ok("channel_closed");
                }
                heartbeat.reset();
                if stream.passed_on().await.is_err() {
                    return Ok("sandbox_stopped");
                }
            }
            Some(WatchItem::End(end)) => {
                return match end.error {
                    Some(error) => Err(crate::ops::fs_error(error)),
                    None => Ok("sandbox_stopped"),
                };
            }
            // The link to the agent is gone: the sandbox stopped (or its agent broke the
            // watch's rules, which ends it the same way).
            None => return Ok("sandbox_stopped"),
        }
    }
}

/// Writes lines as one message; a caller that takes nothing for [`STALL_TIMEOUT`] has
/// given up.
async fn send(writer: &ChannelWriter, lines: &[Value]) -> Result<(), String> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut bytes = Vec::new();
    for line in lines {
        serde_json::to_writer(&mut bytes, line).map_err(|e| e.to_string())?;
        bytes.push(b'\n');
    }
    match tokio::time::timeout(STALL_TIMEOUT, writer.write(&bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the reader took nothing for 60 s".into()),
    }
}

/// The caller's lines from the agent's events, and what went out.
struct Lines {
    /// The watched path, without a trailing `/` (empty for `/`).
    base: String,
    events: u64,
    overflows: u64,
    limit: Value,
}

impl Lines {
    fn new(path: &str) -> Lines {
        Lines {
            base: path.trim_end_matches('/').to_string(),
            events: 0,
            overflows: 0,
            limit: Value::Null,
        }
    }

    /// The absolute guest path of a relative one the agent sent, if it is one.
    fn full(&self, rel: &str) -> Option<String> {
        if rel.is_empty() {
            return Some(if self.base.is_empty() {
                "/".into()
            } else {
                self.base.clone()
            });
        }
        let fine = rel.len() <= MAX_EVENT_PATH
            && !rel.contains('\0')
            && rel
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        fine.then(|| format!("{}/{rel}", self.base))
    }

    fn overflow(&mut self) -> Value {
        self.overflows += 1;
        json!({"kind": "overflow"})
    }

    fn line(&mut self, event: &WatchEvent) -> Value {
        let kind = match event.kind {
            WatchKind::Overflow => return self.overflow(),
            WatchKind::Limit => {
                let limit = json!({
                    "code": "S400",
                    "message": "the watch reached its directory limit (max_dirs, or the \
                                sandbox's share of inotify watches): directories past it are \
                                not watched",
                });
                self.limit = limit.clone();
                let mut line = limit;
                line["kind"] = "limit".into();
                return line;
            }
            WatchKind::Created => "created",
            WatchKind::Modified => "modified",
            WatchKind::Deleted => "deleted",
            WatchKind::Moved => "moved",
        };
        let Some(path) = self.full(&event.path) else {
            return self.overflow();
        };
        let from = match &event.from {
            Some(from) => match self.full(from) {
                Some(from) => Some(from),
                None => return self.overflow(),
            },
            None => None,
        };
        self.events += 1;
        let mut line = json!({"path": path, "kind": kind, "is_dir": event.is_dir});
        if let Some(from) = from {
            line["from"] = from.into();
            line["to"] = line["path"].clone();
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: WatchKind, path: &str, from: Option<&str>) -> WatchEvent {
        WatchEvent {
            kind,
            path: path.into(),
            is_dir: false,
            from: from.map(Into::into),
        }
    }

    #[test]
    fn guest_paths_are_checked_and_joined_under_the_watched_path() {
        let mut lines = Lines::new("/work/");
        let line = lines.line(&event(WatchKind::Created, "a/b.txt", None));
        assert_eq!(
            line,
            json!({"path": "/work/a/b.txt", "kind": "created", "is_dir": false})
        );
        let moved = lines.line(&event(WatchKind::Moved, "b", Some("a")));
        assert_eq!(moved["from"], "/work/a");
        assert_eq!(moved["to"], "/work/b");
        assert_eq!(
            lines.line(&event(WatchKind::Deleted, "", None))["path"],
            "/work"
        );
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "a/../../x",
            "a//b",
            "./a",
            "a/",
            "a\0b",
        ] {
            let line = lines.line(&event(WatchKind::Modified, bad, None));
            assert_eq!(line, json!({"kind": "overflow"}), "{bad:?}");
        }
        let long = "a".repeat(MAX_EVENT_PATH + 1);
        assert_eq!(
            lines.line(&event(WatchKind::Modified, &long, None))["kind"],
            "overflow"
        );
        let bad_from = lines.line(&event(WatchKind::Moved, "b", Some("../x")));
        assert_eq!(bad_from["kind"], "overflow");
        assert_eq!((lines.events, lines.overflows), (3, 9));
        let root = Lines::new("/").full("etc").unwrap();
        assert_eq!(root, "/etc");
    }

    #[test]
    fn a_limit_is_a_line_and_stays_in_the_reply() {
        let mut lines = Lines::new("/w");
        let line = lines.line(&event(WatchKind::Limit, "", None));
        assert_eq!(line["kind"], "limit");
        assert_eq!(line["code"], "S400");
        assert_eq!(lines.limit["code"], "S400");
    }
}
