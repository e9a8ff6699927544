//! `fs::mkdir`, `fs::rm`, `fs::chmod`, `fs::mv`: changes to the directory tree.

use std::sync::Arc;

use agent_proto::{FsRequest, FsResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{begin, guest_path, mode, on_agent, unexpected, with_parents_fix};
use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::request::parse;

/// Default mode of a new directory.
const DIR_MODE: u32 = 0o755;

#[derive(Debug, Deserialize)]
struct MkdirRequest {
    sandbox_id: String,
    path: String,
    mode: Option<String>,
    #[serde(default)]
    parents: bool,
}

#[derive(Debug, Deserialize)]
struct RmRequest {
    sandbox_id: String,
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Debug, Deserialize)]
struct ChmodRequest {
    sandbox_id: String,
    path: String,
    mode: String,
    uid: Option<u32>,
    gid: Option<u32>,
    #[serde(default)]
    recursive: bool,
}

#[derive(Debug, Deserialize)]
struct MvRequest {
    sandbox_id: String,
    src: String,
    dst: String,
    #[serde(default)]
    overwrite: bool,
}

pub async fn mkdir<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: MkdirRequest = parse(payload)?;
    let mode = mode::parse("mode", request.mode.as_deref(), DIR_MODE)?;
    guest_path("path", &request.path)?;
    let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
    let op = FsRequest::Mkdir {
        path: request.path,
        mode,
        parents: request.parents,
    };
    match on_agent(&sandbox, op)
        .await
        .map_err(|e| with_parents_fix(e, request.parents))?
    {
        FsResponse::Created { created } => Ok(json!({"created": created})),
        other => Err(unexpected("mkdir", &other)),
    }
}

pub async fn rm<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: RmRequest = parse(payload)?;
    guest_path("path", &request.path)?;
    let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
    let op = FsRequest::Rm {
        path: request.path,
        recursive: request.recursive,
    };
    match on_agent(&sandbox, op).await? {
        FsResponse::Removed { removed } => Ok(json!({"removed": removed})),
        other => Err(unexpected("rm", &other)),
    }
}

pub async fn chmod<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: ChmodRequest = parse(payload)?;
    let mode = mode::parse("mode", Some(&request.mode), 0)?;
    guest_path("path", &request.path)?;
    let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
    let op = FsRequest::Chmod {
        path: request.path,
        mode,
        uid: request.uid,
        gid: request.gid,
        recursive: request.recursive,
    };
    match on_agent(&sandbox, op).await? {
        FsResponse::Updated { updated } => Ok(json!({"updated": updated})),
        other => Err(unexpected("chmod", &other)),
    }
}

pub async fn mv<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: MvRequest = parse(payload)?;
    guest_path("src", &request.src)?;
    guest_path("dst", &request.dst)?;
    let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
    let op = FsRequest::Mv {
        src: request.src,
        dst: request.dst,
        overwrite: request.overwrite,
    };
    match on_agent(&sandbox, op).await? {
        FsResponse::Moved { moved } => Ok(json!({"moved": moved})),
        other => Err(unexpected("mv", &other)),
    }
}
