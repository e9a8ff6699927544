//! `adapter::info`: who we are, what we implement, and whether this host can run sandboxes.

use serde_json::{json, Value};

use crate::backend::{Backend, Bounds};
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

/// The target triple this build was compiled for (`x86_64-unknown-linux-gnu`,
/// `aarch64-unknown-linux-gnu`, ...), from the build script.
pub const TARGET: &str = env!("SANDBOX_TARGET");

pub fn info<B: Backend>(plugin: &SandboxPlugin<B>) -> Value {
    let probe = plugin.backend.probe();
    json!({
        "adapter": plugin.adapter,
        "adapter_version": plugin.adapter_version,
        "target": TARGET,
        "contract": {"major": CONTRACT.major, "minor": CONTRACT.minor},
        "features": FEATURES,
        "backend": {
            "name": plugin.backend.name(),
            "ready": probe.is_ok(),
            "reason": probe.err().map(|e| e.to_string()),
            "isolation": plugin.backend.isolation(),
            "limits": limits(plugin),
        },
        "warm_pool": plugin.pool.status(),
        "boots": plugin.pool.boots(),
        // Subscribers of the lifecycle-event trigger types (docs/events.md).
        "events": {"subscribers": plugin.events.subscribers()},
        // The shell's connection to the engine (null under a shell that reports none): how
        // an operator tells a lost or contested bus name from a healthy one.
        "bus": plugin.host.bus_state(),
        // iii's sandbox family: the provider name the router reaches this adapter by (null
        // when the family surface is off) and what its `create` announces.
        "family": plugin_api::manifest::family_name_from_env().ok().flatten().map(|name| json!({
            "name": name,
            "prefix": plugin_api::manifest::family_function_id(&name, "").trim_end_matches(':'),
            "capabilities": plugin.family_capabilities,
        })),
    })
}

/// Whether sandboxes' cpus, memory and pids are bounded here, by what, and what a create
/// does where they cannot be (`allow_unbounded_sandboxes`).
fn limits<B: Backend>(plugin: &SandboxPlugin<B>) -> Value {
    let allowed = plugin.config.allow_unbounded_sandboxes;
    match plugin.backend.bounds() {
        Bounds::Held(by) => json!({
            "bounded": true,
            "by": by,
            "allow_unbounded_sandboxes": allowed,
        }),
        Bounds::Missing(missing) => json!({
            "bounded": false,
            "missing": missing,
            "allow_unbounded_sandboxes": allowed,
            "creates": if allowed {
                "sandboxes are created NOT bounded: their cpus, memory and pids hold no limit (allow_unbounded_sandboxes: true)"
            } else {
                "refused (S300) until the adapter can bound them, or allow_unbounded_sandboxes: true"
            },
        }),
    }
}
