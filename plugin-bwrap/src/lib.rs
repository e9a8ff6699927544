//! The bubblewrap plugin: sandbox-core over Linux namespaces (`bwrap --unshare-all`), for hosts
//! and CI machines without usable KVM, and for development. Adapter name `sandbox-bwrap`; run
//! the shell with `--prefix sandbox-libkrun` to stand in for the libkrun adapter.
//!
//! Isolation is namespaces, not a VM: good enough for tests and trusted code, not a security
//! boundary for hostile code the way a microVM is.

#![deny(unsafe_code)]

mod backend;
mod cgroup;
pub mod disk;
pub mod fuse_disk;
pub mod launch;
pub mod ns_limits;
mod owners;
mod pool;
pub mod userns;

/// The sandbox network's set-up and starter side, shared with the libkrun VM runner.
pub use egress::{dns, netns, network};

use std::sync::Arc;

use plugin_api::{Host, Manifest, Plugin};
use sandbox_core::SandboxPlugin;

pub use backend::BwrapBackend;

pub const ADAPTER: &str = "sandbox-bwrap";

fn manifest() -> Manifest {
    sandbox_core::functions::manifest(ADAPTER, env!("CARGO_PKG_VERSION"))
}

fn init(config: &serde_json::Value, host: Host) -> Result<Arc<dyn Plugin>, String> {
    // The backend sizes each sandbox's share of the host by the sandbox cap and pids.
    let parsed = sandbox_core::Config::from_json(config).map_err(|e| e.to_string())?;
    let plugin = SandboxPlugin::start(
        ADAPTER,
        env!("CARGO_PKG_VERSION"),
        config,
        BwrapBackend::for_config(&parsed),
        host,
    )?;
    Ok(plugin)
}

plugin_api::export_plugin!(manifest, init);
