//! The plugin every backend exports: routes each call by id suffix to its operation and turns
//! every failure into an S-code body.

use std::sync::Arc;

use plugin_api::{ErrorBody, Plugin, PluginFuture};
use serde_json::Value;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::SandboxError;
use crate::ops;

/// Shared state of one running plugin instance.
pub struct SandboxPlugin<B: Backend> {
    pub(crate) adapter: &'static str,
    pub(crate) adapter_version: &'static str,
    pub(crate) config: Config,
    pub(crate) backend: B,
}

impl<B: Backend> SandboxPlugin<B> {
    /// Validates `config` and builds the plugin; the error is the one-line reason the shell
    /// prints before exiting 2.
    pub fn new(
        adapter: &'static str,
        adapter_version: &'static str,
        config: &Value,
        backend: B,
    ) -> Result<Self, String> {
        let config = Config::from_json(config).map_err(|e| e.to_string())?;
        Ok(Self {
            adapter,
            adapter_version,
            config,
            backend,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    async fn dispatch(
        self: Arc<Self>,
        function: String,
        payload: Value,
    ) -> Result<Value, SandboxError> {
        match function.as_str() {
            "adapter::info" => Ok(ops::info::info(&self)),
            f if f.starts_with("worker::") => Err(SandboxError::BootFailed(
                "worker VMs are not available in this build of the adapter yet".into(),
            )),
            other => {
                let _ = payload;
                Err(SandboxError::InvalidRequest(format!(
                    "unknown function `{other}`"
                )))
            }
        }
    }
}

impl<B: Backend> Plugin for SandboxPlugin<B> {
    fn invoke(self: Arc<Self>, function: String, payload: Value) -> PluginFuture {
        Box::pin(async move {
            self.dispatch(function, payload)
                .await
                .map_err(ErrorBody::from)
        })
    }
}
