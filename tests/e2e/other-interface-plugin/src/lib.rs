//! A minimal plugin whose plugin-api claims another interface version; the shell must refuse
//! to load it (exit 2) before calling anything in it.

use std::sync::Arc;

use plugin_api::{ContractVersion, Host, Manifest, Plugin};

fn manifest() -> Manifest {
    Manifest {
        adapter: "other-interface".into(),
        adapter_version: "0".into(),
        contract: ContractVersion { major: 1, minor: 1 },
        functions: Vec::new(),
        family: Vec::new(),
    }
}

fn init(_config: &serde_json::Value, _host: Host) -> Result<Arc<dyn Plugin>, String> {
    Err("this plugin only exists to be refused".into())
}

plugin_api::export_plugin!(manifest, init);
