//! `stop`: idempotent; `wait` returns only once the sandbox and its layer are gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{parse, sandbox_id};

/// How long the agent gets to end its programs before the sandbox is killed.
const AGENT_GOODBYE: Duration = Duration::from_secs(2);

#[derive(Debug, Deserialize)]
struct StopRequest {
    sandbox_id: String,
    #[serde(default)]
    wait: bool,
}

pub async fn stop<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: StopRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    if let Some(sandbox) = plugin.registry.take(id, true)? {
        if request.wait {
            teardown(plugin, sandbox).await;
        } else {
            let plugin = Arc::clone(plugin);
            tokio::spawn(async move { teardown(&plugin, sandbox).await });
        }
    }
    Ok(json!({ "sandbox_id": id.to_string(), "stopped": true }))
}

/// Ends a sandbox taken out of the registry: its programs, its process, its layer.
pub async fn teardown<B: Backend>(plugin: &SandboxPlugin<B>, sandbox: Arc<Sandbox>) {
    let started = Instant::now();
    let _ = tokio::time::timeout(AGENT_GOODBYE, sandbox.agent.shutdown()).await;
    let goodbye = started.elapsed();
    sandbox.process.kill().await;
    let killed = started.elapsed();
    plugin.state.remove_layer(&plugin.backend, &sandbox.layer);
    let ms = |d: Duration| (d.as_secs_f64() * 100_000.0).round() / 100.0;
    // The phase timings feed the benchmark's breakdown (`sandbox-bench` reads this line).
    tracing::info!(
        sandbox_id = %sandbox.id,
        goodbye_ms = ms(goodbye),
        kill_ms = ms(killed - goodbye),
        layer_ms = ms(started.elapsed() - killed),
        "sandbox stopped"
    );
}
