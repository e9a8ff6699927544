//! The `fs::*` functions of SPEC.md section 2: request parsing and response shaping on the
//! host; the filesystem work itself is the agent's (`agent_proto::FsRequest`). One file per
//! group of verbs. Payload-shape errors are S001; filesystem verdicts (S21x) come from the
//! agent, except relative paths, refused here as S210 before any round trip.

pub(crate) mod channel;
mod entries;
mod file;
mod mode;
pub mod schema;
mod search;
mod tree;
mod watch;

use std::sync::Arc;

use agent_proto::{AgentError, FsRequest, FsResponse, FS_CALL_TIMEOUT};
use serde_json::Value;

use crate::backend::Backend;
use crate::error::{FsCode, SandboxError};
use crate::ops::exec::agent_failure;
use crate::plugin::SandboxPlugin;
use crate::registry::{CallGuard, Sandbox};
use crate::request::sandbox_id;

/// Routes `fs::<verb>`; an unknown verb is an unknown function (S001).
pub async fn dispatch<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    verb: &str,
    payload: Value,
) -> Result<Value, SandboxError> {
    match verb {
        "ls" => entries::ls(plugin, payload).await,
        "stat" => entries::stat(plugin, payload).await,
        "mkdir" => tree::mkdir(plugin, payload).await,
        "rm" => tree::rm(plugin, payload).await,
        "chmod" => tree::chmod(plugin, payload).await,
        "mv" => tree::mv(plugin, payload).await,
        "write" => file::write(plugin, payload).await,
        "read" => file::read(plugin, payload).await,
        "grep" => search::grep(plugin, payload).await,
        "sed" => search::sed(plugin, payload).await,
        "watch" => watch::watch(plugin, payload).await,
        other => Err(SandboxError::InvalidRequest(format!(
            "unknown function `fs::{other}`"
        ))),
    }
}

/// The live sandbox named by `id`, held for the call's duration: the reaper leaves a sandbox
/// alone while any guard on it is alive. A paused one is resumed first.
async fn begin<B: Backend>(
    plugin: &SandboxPlugin<B>,
    id: &str,
) -> Result<(Arc<Sandbox>, CallGuard), SandboxError> {
    let id = sandbox_id(id)?;
    let (sandbox, call) = plugin.registry.begin_call(id)?;
    crate::ops::pause::wake(&sandbox, &plugin.events).await?;
    Ok((sandbox, call))
}

/// One filesystem operation in `sandbox`'s agent. It ends: the agent answers S216 at its
/// deadline, and the client gives up on an agent that does not, also S216 here, so no call
/// keeps the sandbox from its idle timeout for ever.
async fn on_agent(sandbox: &Sandbox, op: FsRequest) -> Result<FsResponse, SandboxError> {
    match sandbox.agent.fs(op).await {
        Ok(response) => Ok(response),
        Err(AgentError::Unresponsive { .. }) => Err(SandboxError::Fs {
            code: FsCode::Io,
            message: format!(
                "the agent did not answer within {} s: timed out",
                FS_CALL_TIMEOUT.as_secs()
            ),
            fix: None,
        }),
        Err(e) => Err(agent_failure(sandbox, e).await),
    }
}

/// Paths name the guest's tree: absolute, without NUL (S210 otherwise).
fn guest_path(field: &str, path: &str) -> Result<(), SandboxError> {
    if path.starts_with('/') && !path.contains('\0') {
        return Ok(());
    }
    Err(SandboxError::Fs {
        code: FsCode::BadRequest,
        message: format!("`{field}` must be an absolute path inside the sandbox, got {path:?}"),
        fix: None,
    })
}

/// The agent answered with a shape that does not belong to the request: a protocol bug.
fn unexpected(verb: &str, response: &FsResponse) -> SandboxError {
    SandboxError::Internal(format!(
        "the agent answered fs::{verb} with an unexpected result: {response:?}"
    ))
}

/// A missing parent directory without `parents: true` gets the fix that makes the call work.
fn with_parents_fix(error: SandboxError, parents: bool) -> SandboxError {
    match error {
        SandboxError::Fs {
            code: FsCode::NotFound,
            message,
            fix: None,
        } if !parents => SandboxError::Fs {
            code: FsCode::NotFound,
            message,
            fix: Some((
                serde_json::json!({"parents": true}),
                "retry with `parents: true` to create the missing parent directories".into(),
            )),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_nul_paths_are_s210() {
        assert!(guest_path("path", "/tmp/x").is_ok());
        for bad in ["tmp/x", "", "./x", "/a\0b"] {
            let error = guest_path("path", bad).unwrap_err();
            assert_eq!(error.code(), "S210", "{bad:?}");
        }
    }

    #[test]
    fn parents_fix_only_for_not_found_without_parents() {
        let not_found = || SandboxError::Fs {
            code: FsCode::NotFound,
            message: "/a: parent directory does not exist".into(),
            fix: None,
        };
        let fixed = with_parents_fix(not_found(), false).to_body();
        assert_eq!(fixed.code, "S211");
        assert_eq!(fixed.fix, serde_json::json!({"parents": true}));
        assert_eq!(
            with_parents_fix(not_found(), true).to_body().fix,
            Value::Null
        );
        let exists = SandboxError::Fs {
            code: FsCode::Exists,
            message: "x".into(),
            fix: None,
        };
        assert_eq!(with_parents_fix(exists, false).to_body().fix, Value::Null);
    }
}
