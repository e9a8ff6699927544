//! `fs::ls` and `fs::stat`: what is at a path.

use std::sync::Arc;

use agent_proto::{FsRequest, FsResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::mode::entry_json;
use super::{begin, guest_path, on_agent, unexpected};
use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::request::parse;

#[derive(Debug, Deserialize)]
struct PathRequest {
    sandbox_id: String,
    path: String,
}

pub async fn ls<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: PathRequest = parse(payload)?;
    guest_path("path", &request.path)?;
    let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
    match on_agent(&sandbox, FsRequest::Ls { path: request.path }).await? {
        FsResponse::Entries { entries } => Ok(json!({
            "entries": entries.iter().map(entry_json).collect::<Vec<_>>(),
        })),
        other => Err(unexpected("ls", &other)),
    }
}

pub async fn stat<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: PathRequest = parse(payload)?;
    guest_path("path", &request.path)?;
    let (sandbox, _call) = begin(plugin, &request.sandbox_id).await?;
    match on_agent(&sandbox, FsRequest::Stat { path: request.path }).await? {
        FsResponse::Entry { entry } => Ok(entry_json(&entry)),
        other => Err(unexpected("stat", &other)),
    }
}
