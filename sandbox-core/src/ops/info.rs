//! `adapter::info`: who we are, what we implement, and whether this host can run sandboxes.

use serde_json::{json, Value};

use crate::backend::Backend;
use crate::functions::CONTRACT;
use crate::plugin::SandboxPlugin;

/// Capabilities this build serves; grows as operations land.
pub const FEATURES: &[&str] = &[
    "create",
    "exec",
    "stop",
    "list",
    "run",
    "fs",
    "fs_grep",
    "fs_sed",
    "catalog",
    "idle_reaping",
    "reconcile",
    "worker_token_guard",
    "worker_vms",
    "warm_pool",
];

pub fn info<B: Backend>(plugin: &SandboxPlugin<B>) -> Value {
    let probe = plugin.backend.probe();
    json!({
        "adapter": plugin.adapter,
        "adapter_version": plugin.adapter_version,
        "contract": {"major": CONTRACT.major, "minor": CONTRACT.minor},
        "features": FEATURES,
        "backend": {
            "name": plugin.backend.name(),
            "ready": probe.is_ok(),
            "reason": probe.err().map(|e| e.to_string()),
            "isolation": plugin.backend.isolation(),
        },
        "warm_pool": plugin.pool.status(),
        "boots": plugin.pool.boots(),
    })
}
