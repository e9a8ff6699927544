//! The bubblewrap plugin: sandbox-core over Linux namespaces (`bwrap --unshare-all`), for hosts
//! and CI machines without usable KVM, and for development. Adapter name `sandbox-bwrap`; run
//! the shell with `--prefix sandbox-libkrun` to stand in for the libkrun adapter.

#![forbid(unsafe_code)]

use std::sync::Arc;

use plugin_api::{Manifest, Plugin};
use sandbox_core::{Backend, HostUnfit, SandboxPlugin};

pub const ADAPTER: &str = "sandbox-bwrap";

pub struct BwrapBackend;

impl Backend for BwrapBackend {
    fn name(&self) -> &'static str {
        "bwrap"
    }

    fn probe(&self) -> Result<(), HostUnfit> {
        find_in_path("bwrap").map(|_| ()).ok_or_else(|| {
            HostUnfit("`bwrap` is not installed (Debian package `bubblewrap`)".into())
        })
    }
}

fn find_in_path(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn manifest() -> Manifest {
    sandbox_core::functions::manifest(ADAPTER, env!("CARGO_PKG_VERSION"))
}

fn init(config: &serde_json::Value) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(SandboxPlugin::new(
        ADAPTER,
        env!("CARGO_PKG_VERSION"),
        config,
        BwrapBackend,
    )?))
}

plugin_api::export_plugin!(manifest, init);
