//! The libkrun plugin: sandbox-core over libkrun microVMs. Adapter name `sandbox-libkrun`.
//!
//! Each sandbox is one `sandbox-libkrun-vm` process (crate `vm-runner`), because
//! `krun_start_enter` never returns: the runner mounts the sandbox's overlay root in a private
//! mount namespace, boots the microVM and runs the static agent in it, which dials back over a
//! vsock port bridged to a unix socket this plugin listens on. This crate holds no VM code and
//! no `unsafe`; it builds the runner's specification and owns its process.
//!
//! | module | concern |
//! | --- | --- |
//! | [`backend`] | the `Backend`: probe, boot (listen, spawn, accept), the runner process |
//! | `vm_spec` | the runner's specification for one sandbox |
//! | `layout` | the files of a sandbox's layer directory (agent copy, socket, logs) |
//! | `failure` | boot errors, with the exit status and the console log's tail |

#![forbid(unsafe_code)]

mod agent_wait;
pub mod backend;
mod failure;
mod layout;
mod runner_files;
mod vm_spec;

use std::sync::Arc;

use plugin_api::{Host, Manifest, Plugin};
use sandbox_core::SandboxPlugin;

pub use backend::LibkrunBackend;

pub const ADAPTER: &str = "sandbox-libkrun";

fn manifest() -> Manifest {
    sandbox_core::functions::manifest(ADAPTER, env!("CARGO_PKG_VERSION"))
}

fn init(config: &serde_json::Value, host: Host) -> Result<Arc<dyn Plugin>, String> {
    // The backend sizes each sandbox runner's share of the host's open files by the cap.
    let parsed = sandbox_core::Config::from_json(config).map_err(|e| e.to_string())?;
    Ok(SandboxPlugin::start(
        ADAPTER,
        env!("CARGO_PKG_VERSION"),
        config,
        LibkrunBackend::new().with_sandbox_cap(parsed.max_concurrent_sandboxes),
        host,
    )?)
}

plugin_api::export_plugin!(manifest, init);
