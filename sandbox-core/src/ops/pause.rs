//! `pause` and `resume`: a sandbox's processes frozen where they stand (memory kept) and
//! continued. While paused, a sandbox uses no CPU, its idle timer does not run, `list` shows
//! `paused: true`, and it is stopped once paused for `max_paused_secs`. An `exec` or `fs::*`
//! call on a paused sandbox resumes it first ([`wake`]); `stop` thaws it to tear it down.
//! A pause closes the sandbox's exposed ports; a resume does not reopen them.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{parse, sandbox_id};

#[derive(Debug, Deserialize)]
struct PauseRequest {
    sandbox_id: String,
}

pub async fn pause<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let sandbox = target(plugin, payload)?;
    // A frozen server would leave its exposed ports' clients hanging: the exposures close
    // first (connections refused while paused), and a failed freeze lets new ones open again.
    // Only here: a snapshot's brief freeze keeps them.
    sandbox.exposures.suspend();
    if let Err(e) = sandbox.pause().await {
        sandbox.exposures.allow();
        return Err(on_backend(plugin.backend.name(), e));
    }
    tracing::info!(sandbox_id = %sandbox.id, "paused");
    plugin
        .events
        .emit(|| crate::events::Event::paused(sandbox.id));
    Ok(json!({"sandbox_id": sandbox.id.to_string(), "paused": true}))
}

pub async fn resume<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let sandbox = target(plugin, payload)?;
    sandbox
        .resume()
        .await
        .map_err(|e| on_backend(plugin.backend.name(), e))?;
    // Ports may be exposed again; the ones the pause closed stay closed.
    sandbox.exposures.allow();
    plugin
        .events
        .emit(|| crate::events::Event::resumed(sandbox.id));
    Ok(json!({"sandbox_id": sandbox.id.to_string(), "paused": false}))
}

/// The live sandbox a request names (S001 for a bad id, S002 unknown, S004 stopped). No
/// call guard is held: a pause is no activity, and the reaper takes a paused sandbox only
/// past `max_paused_secs`.
fn target<B: Backend>(
    plugin: &SandboxPlugin<B>,
    payload: Value,
) -> Result<Arc<Sandbox>, SandboxError> {
    let request: PauseRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    plugin.registry.live_sandbox(id)
}

/// Names the backend in a refusal, so the caller knows it is this backend's limit.
fn on_backend(backend: &str, error: SandboxError) -> SandboxError {
    match error {
        SandboxError::BackendUnsupported(why) => {
            SandboxError::BackendUnsupported(format!("pause and resume on {backend}: {why}"))
        }
        other => other,
    }
}

/// Resumes a paused sandbox before a call works in it (`exec`, `fs::*`), as E2B's
/// auto-resume does; nothing to do on a running one.
pub async fn wake(sandbox: &Sandbox, events: &crate::events::Events) -> Result<(), SandboxError> {
    if !sandbox.is_paused() {
        return Ok(());
    }
    tracing::info!(sandbox_id = %sandbox.id, "a call on the paused sandbox resumes it");
    sandbox.resume().await?;
    sandbox.exposures.allow();
    events.emit(|| crate::events::Event::resumed(sandbox.id));
    Ok(())
}
