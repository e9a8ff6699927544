//! `metrics`: what a sandbox uses now, from what its backend already keeps (cgroup counters,
//! the network namespace's), never by asking its agent: a paused sandbox answers without
//! being resumed, and a hostile guest cannot make the call wait. A field the backend cannot
//! give is null (see docs/functions-lifecycle.md).

use std::sync::Arc;
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::request::{parse, sandbox_id};

#[derive(Debug, Deserialize)]
struct MetricsRequest {
    sandbox_id: String,
}

pub fn metrics<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: MetricsRequest = parse(payload)?;
    let sandbox = plugin
        .registry
        .live_sandbox(sandbox_id(&request.sandbox_id)?)?;
    let counters = sandbox.process.counters();
    let uptime_ms = SystemTime::now()
        .duration_since(sandbox.created)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Ok(json!({
        "sandbox_id": sandbox.id.to_string(),
        "cpu_ms": counters.cpu_ms,
        "memory_bytes": counters.memory_bytes,
        "memory_peak_bytes": counters.memory_peak_bytes,
        "disk_bytes": counters.disk_bytes,
        "pids": counters.pids,
        "net_rx_bytes": counters.net_rx_bytes,
        "net_tx_bytes": counters.net_tx_bytes,
        "uptime_ms": uptime_ms,
    }))
}
