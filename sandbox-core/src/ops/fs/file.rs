//! `fs::write` and `fs::read`: file contents. Channels (SPEC's `content` refs) need a bus
//! handle the plugin does not have yet, so reads answer inline `body` text up to
//! `BODY_LIMIT` and S219 beyond it or for non-UTF-8 files.

use std::sync::Arc;

use agent_proto::{FsRequest, FsResponse};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{begin, guest_path, mode, on_agent, unexpected, with_parents_fix};
use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::parse;

/// Default mode of a new file.
const FILE_MODE: u32 = 0o644;
/// Largest file `fs::read` answers inline as `body` (SPEC.md: 1 MiB).
pub const BODY_LIMIT: u64 = 1024 * 1024;
/// Bytes asked of the agent per read; the host holds at most `BODY_LIMIT` + one page.
const READ_PAGE: u64 = 256 * 1024;

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

pub async fn write<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: WriteRequest = parse(payload)?;
    let data = content_bytes(request.content, request.content_b64.as_deref())?;
    let mode = mode::parse("mode", request.mode.as_deref(), FILE_MODE)?;
    guest_path("path", &request.path)?;
    let (sandbox, _call) = begin(plugin, &request.sandbox_id)?;
    let op = FsRequest::Write {
        path: request.path,
        mode,
        parents: request.parents,
        append: false,
        data,
    };
    match on_agent(&sandbox, op)
        .await
        .map_err(|e| with_parents_fix(e, request.parents))?
    {
        FsResponse::Written {
            bytes_written,
            path,
        } => Ok(json!({"bytes_written": bytes_written, "path": path})),
        other => Err(unexpected("write", &other)),
    }
}

/// Exactly one of `content` (a UTF-8 string) and `content_b64`.
fn content_bytes(content: Option<Value>, b64: Option<&str>) -> Result<Vec<u8>, SandboxError> {
    match (content, b64) {
        (Some(Value::String(text)), None) => Ok(text.into_bytes()),
        (Some(Value::Object(_)), None) => Err(SandboxError::Unsupported(
            "`content` as a channel ref is not supported yet (channel streaming is not \
             available in this build); send `content` as a string or `content_b64`"
                .into(),
        )),
        (Some(_), None) => Err(SandboxError::InvalidRequest(
            "`content` must be a UTF-8 string".into(),
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
    let (sandbox, _call) = begin(plugin, &request.sandbox_id)?;
    let file = read_bounded(&sandbox, &request.path).await?;
    let body = String::from_utf8(file.data)
        .map_err(|_| too_big_or_binary(&request.path, "is not UTF-8 text"))?;
    Ok(json!({
        "content": Value::Null,
        "body": body,
        "size": file.size,
        "mode": mode::render(file.mode),
        "mtime": file.mtime,
    }))
}

struct SmallFile {
    data: Vec<u8>,
    size: u64,
    mode: u32,
    mtime: i64,
}

/// Pages through the file; S219 as soon as it proves larger than `BODY_LIMIT`.
async fn read_bounded(sandbox: &Sandbox, path: &str) -> Result<SmallFile, SandboxError> {
    let mut data = Vec::new();
    loop {
        let op = FsRequest::Read {
            path: path.to_string(),
            offset: data.len() as u64,
            max_bytes: READ_PAGE,
        };
        let FsResponse::Read {
            size,
            mode,
            mtime,
            data: page,
        } = on_agent(sandbox, op).await?
        else {
            return Err(SandboxError::Internal(format!(
                "the agent answered fs::read of {path} with an unexpected result"
            )));
        };
        if size > BODY_LIMIT {
            return Err(too_big_or_binary(path, "is larger than 1 MiB"));
        }
        let last = (page.len() as u64) < READ_PAGE;
        data.extend_from_slice(&page);
        if data.len() as u64 > BODY_LIMIT {
            return Err(too_big_or_binary(path, "grew past 1 MiB while being read"));
        }
        if last {
            return Ok(SmallFile {
                data,
                size,
                mode,
                mtime,
            });
        }
    }
}

fn too_big_or_binary(path: &str, what: &str) -> SandboxError {
    SandboxError::Unsupported(format!(
        "{path} {what}: such files are returned through a channel, and channel streaming is \
         not available in this build yet (read it with exec, e.g. `base64 {path}`)"
    ))
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
        assert_eq!(content_bytes(None, Some("AP8=")).unwrap(), vec![0, 255]);
        assert_eq!(content_bytes(None, Some("AP8")).unwrap(), vec![0, 255]);
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
            let error = content_bytes(content.clone(), b64).unwrap_err();
            assert_eq!(error.code(), "S001", "{content:?} {b64:?}");
        }
        let channel = content_bytes(Some(json!({"channel_id": "x"})), None).unwrap_err();
        assert_eq!(channel.code(), "S219");
    }
}
