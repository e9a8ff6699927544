//! `fs::write` and `fs::read`: file contents. Small text travels inline (`content` string,
//! `body`); any size travels through an engine channel (SPEC's `content` refs), paged through
//! the agent so the adapter holds at most a page or two of a file at any time.

use std::sync::Arc;

use agent_proto::{FsRequest, FsResponse};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::channel::{self, Channel, STALL_TIMEOUT};
use super::{begin, guest_path, mode, on_agent, unexpected, with_parents_fix};
use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::parse;

/// Default mode of a new file.
const FILE_MODE: u32 = 0o644;
/// Largest file `fs::read` also answers inline as `body` (SPEC.md: 1 MiB).
pub const BODY_LIMIT: u64 = 1024 * 1024;
/// Bytes asked of the agent per read.
const READ_PAGE: u64 = 256 * 1024;
/// Bytes of channel input gathered per agent write.
const WRITE_CHUNK: usize = 512 * 1024;

#[derive(Debug, Deserialize)]
struct WriteRequest {
    sandbox_id: String,
    path: String,
    content: Option<Value>,
    content_b64: Option<String>,
    mode: Option<String>,
    #[serde(default)]
    parents: bool,
}

#[derive(Debug, Deserialize)]
struct ReadRequest {
    sandbox_id: String,
    path: String,
}

/// Where the whole file sits and how to write it.
struct Target {
    path: String,
    mode: u32,
    parents: bool,
}

pub async fn write<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: WriteRequest = parse(payload)?;
    let target = Target {
        mode: mode::parse("mode", request.mode.as_deref(), FILE_MODE)?,
        parents: request.parents,
        path: request.path,
    };
    guest_path("path", &target.path)?;
    let bytes_written = match (request.content, request.content_b64) {
        (Some(content @ Value::Object(_)), None) => {
            let reader = channel::reader_from(&plugin.host, &content)?;
            let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
            write_from_channel(&sandbox, &target, &reader).await?
        }
        (content, b64) => {
            let data = content_bytes(content, b64)?;
            let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
            write_chunk(&sandbox, &target, data, false).await?
        }
    };
    Ok(json!({"bytes_written": bytes_written, "path": target.path}))
}

/// Streams the caller's channel into the file, a chunk at a time (the first truncates).
async fn write_from_channel(
    sandbox: &Sandbox,
    target: &Target,
    reader: &iii_sdk::channel::ChannelReader,
) -> Result<u64, SandboxError> {
    let mut written = 0;
    let mut chunk = Vec::with_capacity(WRITE_CHUNK);
    loop {
        let next = tokio::time::timeout(STALL_TIMEOUT, reader.next_binary())
            .await
            .map_err(|_| {
                channel::aborted(format!(
                    "the content channel sent nothing for {} s ({written} bytes written)",
                    STALL_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| {
                channel::aborted(format!(
                    "reading the content channel failed after {written} bytes: {e}"
                ))
            })?;
        let finished = next.is_none();
        chunk.extend_from_slice(&next.unwrap_or_default());
        if chunk.len() >= WRITE_CHUNK || finished {
            let data = std::mem::replace(&mut chunk, Vec::with_capacity(WRITE_CHUNK));
            // The first write creates or truncates the file, even when the stream is empty.
            written += write_chunk(sandbox, target, data, written > 0).await?;
        }
        if finished {
            let _ = reader.close().await;
            return Ok(written);
        }
    }
}

async fn write_chunk(
    sandbox: &Sandbox,
    target: &Target,
    data: Vec<u8>,
    append: bool,
) -> Result<u64, SandboxError> {
    let op = FsRequest::Write {
        path: target.path.clone(),
        mode: target.mode,
        parents: target.parents,
        append,
        data,
    };
    match on_agent(sandbox, op)
        .await
        .map_err(|e| with_parents_fix(e, target.parents))?
    {
        FsResponse::Written { bytes_written, .. } => Ok(bytes_written),
        other => Err(unexpected("write", &other)),
    }
}

/// Exactly one of `content` (a UTF-8 string) and `content_b64`. Takes them by value: the text
/// is moved (`content`) or freed as soon as it is decoded (`content_b64`), so a large write
/// holds its content once while it travels to the agent.
fn content_bytes(content: Option<Value>, b64: Option<String>) -> Result<Vec<u8>, SandboxError> {
    match (content, b64) {
        (Some(Value::String(text)), None) => Ok(text.into_bytes()),
        (Some(_), None) => Err(SandboxError::InvalidRequest(
            "`content` must be a UTF-8 string or a channel ref".into(),
        )),
        (None, Some(text)) => base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|e| SandboxError::InvalidRequest(format!("`content_b64` is not base64: {e}"))),
        (Some(_), Some(_)) => Err(SandboxError::InvalidRequest(
            "give exactly one of `content` and `content_b64`, not both".into(),
        )),
        (None, None) => Err(SandboxError::InvalidRequest(
            "missing `content` or `content_b64`".into(),
        )),
    }
}

pub async fn read<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: ReadRequest = parse(payload)?;
    guest_path("path", &request.path)?;
    let (sandbox, call) = begin(plugin, &request.sandbox_id).await?;
    let head = read_head(&sandbox, &request.path).await?;
    let body = head
        .complete
        .then(|| String::from_utf8(head.data.clone()).ok())
        .flatten();
    let content = match Channel::create(&plugin.host).await {
        Ok(channel) => {
            let content = channel.their_ref();
            let offset = head.data.len() as u64;
            let path = request.path.clone();
            let complete = head.complete;
            let data = head.data;
            // The stream outlives the call's reply: it keeps the sandbox's call guard, so the
            // reaper waits for it too.
            tokio::spawn(async move {
                let streamed = stream_file(&sandbox, &channel, &path, data, offset, complete).await;
                if let Err(e) = streamed {
                    tracing::debug!(%path, error = %e, "fs::read stream ended early");
                }
                drop(call);
            });
            content
        }
        // Without a channel, small text still answers inline.
        Err(e) if body.is_some() => {
            tracing::debug!(error = %e, "fs::read without a channel: body only");
            Value::Null
        }
        Err(e) => return Err(e),
    };
    let mut reply = json!({
        "content": content,
        "size": head.size,
        "mode": mode::render(head.mode),
        "mtime": head.mtime,
    });
    if let Some(body) = body {
        reply["body"] = Value::String(body);
    }
    Ok(reply)
}

/// The start of a file: all of it when it fits `BODY_LIMIT`, else its first page.
struct Head {
    data: Vec<u8>,
    complete: bool,
    size: u64,
    mode: u32,
    mtime: i64,
}

async fn read_head(sandbox: &Sandbox, path: &str) -> Result<Head, SandboxError> {
    let mut data = Vec::new();
    loop {
        let page = read_page(sandbox, path, data.len() as u64).await?;
        let last = (page.data.len() as u64) < READ_PAGE;
        data.extend_from_slice(&page.data);
        if last || page.size > BODY_LIMIT || data.len() as u64 > BODY_LIMIT {
            return Ok(Head {
                complete: last && data.len() as u64 <= BODY_LIMIT,
                data,
                size: page.size,
                mode: page.mode,
                mtime: page.mtime,
            });
        }
    }
}

struct Page {
    data: Vec<u8>,
    size: u64,
    mode: u32,
    mtime: i64,
}

async fn read_page(sandbox: &Sandbox, path: &str, offset: u64) -> Result<Page, SandboxError> {
    let op = FsRequest::Read {
        path: path.to_string(),
        offset,
        max_bytes: READ_PAGE,
    };
    match on_agent(sandbox, op).await? {
        FsResponse::Read {
            size,
            mode,
            mtime,
            data,
        } => Ok(Page {
            data,
            size,
            mode,
            mtime,
        }),
        other => Err(unexpected("read", &other)),
    }
}

/// Writes what was read already, then the rest of the file page by page, then closes.
async fn stream_file(
    sandbox: &Sandbox,
    channel: &Channel,
    path: &str,
    head: Vec<u8>,
    mut offset: u64,
    complete: bool,
) -> Result<(), SandboxError> {
    let writer = channel.writer();
    let send = |data: Vec<u8>| {
        let writer = &writer;
        async move {
            tokio::time::timeout(STALL_TIMEOUT, writer.write(&data))
                .await
                .map_err(|_| channel::aborted("nobody read the content channel".into()))?
                .map_err(|e| channel::aborted(format!("content channel: {e}")))
        }
    };
    send(head).await?;
    let mut done = complete;
    while !done {
        let page = read_page(sandbox, path, offset).await?;
        done = (page.data.len() as u64) < READ_PAGE;
        offset += page.data.len() as u64;
        send(page.data).await?;
    }
    writer
        .close()
        .await
        .map_err(|e| channel::aborted(format!("closing the content channel: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_content_field() {
        assert_eq!(
            content_bytes(Some(json!("hi")), None).unwrap(),
            b"hi".to_vec()
        );
        assert_eq!(
            content_bytes(None, Some("AP8=".into())).unwrap(),
            vec![0, 255]
        );
        assert_eq!(
            content_bytes(None, Some("AP8".into())).unwrap(),
            vec![0, 255]
        );
        assert_eq!(
            content_bytes(Some(json!("")), None).unwrap(),
            Vec::<u8>::new()
        );
        for (content, b64) in [
            (Some(json!("a")), Some("YQ==")),
            (None, None),
            (Some(json!(5)), None),
            (Some(json!(["a"])), None),
            (None, Some("***")),
        ] {
            let error = content_bytes(content.clone(), b64.map(String::from)).unwrap_err();
            assert_eq!(error.code(), "S001", "{content:?} {b64:?}");
        }
    }
}
