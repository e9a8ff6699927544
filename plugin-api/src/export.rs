//! The plugin side: a safe [`Plugin`] trait and the entry points [`crate::export_plugin!`]
//! wires to it.
//!
//! A `cdylib` has its own copy of tokio's thread-local state, so each instance builds and owns
//! its runtime here; calls are spawned onto it and their results come back through a
//! runtime-agnostic channel. Panics are caught at every entry and become internal errors.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abi_stable::std_types::{RResult, RStr, RString};
use async_ffi::{FfiFuture, FutureExt as _};
use futures::FutureExt as _;
use serde_json::Value;

use crate::ffi::{HostBox, InstanceBox, InstanceFfi, InstanceFfi_TO};
use crate::{ErrorBody, Host, Manifest};

pub type PluginFuture = Pin<Box<dyn Future<Output = Result<Value, ErrorBody>> + Send>>;

/// What a plugin implements; everything else about the boundary is this crate's business.
pub trait Plugin: Send + Sync + 'static {
    /// Serves one call of function `function` (the id suffix from the manifest).
    fn invoke(self: Arc<Self>, function: String, payload: Value) -> PluginFuture;

    /// Stops what the plugin runs (sandboxes, VMs). Called once, inside the plugin's runtime.
    fn shutdown(self: Arc<Self>) {}
}

pub type InitFn = fn(&Value, Host) -> Result<Arc<dyn Plugin>, String>;

/// How long shutdown waits for the plugin's tasks before dropping them.
const RUNTIME_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[doc(hidden)]
pub fn manifest_entry(manifest: fn() -> Manifest) -> RString {
    match catch_unwind(manifest) {
        Ok(manifest) => serde_json::to_string(&manifest).unwrap_or_default().into(),
        // An empty string fails manifest parsing on the host, with a clear message there.
        Err(_) => RString::new(),
    }
}

#[doc(hidden)]
pub fn init_entry(config: RStr<'_>, host: HostBox, init: InitFn) -> RResult<InstanceBox, RString> {
    let host = Host::from_ffi(host);
    let result = catch_unwind(AssertUnwindSafe(|| {
        init_instance(config.as_str(), host, init)
    }))
    .unwrap_or_else(|panic| {
        Err(format!(
            "plugin panicked during init: {}",
            panic_text(&panic)
        ))
    });
    match result {
        Ok(instance) => RResult::ROk(InstanceFfi_TO::from_value(
            instance,
            abi_stable::sabi_trait::TD_Opaque,
        )),
        Err(reason) => RResult::RErr(reason.into()),
    }
}

fn init_instance(config: &str, host: Host, init: InitFn) -> Result<Instance, String> {
    init_logging();
    let config: Value =
        serde_json::from_str(config).map_err(|e| format!("configuration is not JSON: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("plugin")
        .build()
        .map_err(|e| format!("cannot start the plugin's runtime: {e}"))?;
    let plugin = {
        let _context = runtime.enter();
        init(&config, host)?
    };
    Ok(Instance {
        handle: runtime.handle().clone(),
        runtime: Mutex::new(Some(runtime)),
        plugin,
    })
}

/// A cdylib has its own copy of `tracing`'s global dispatcher: without a subscriber of its own,
/// everything the plugin logs would vanish. Same format, filter (`RUST_LOG`) and stream
/// (stderr) as the shell's.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

struct Instance {
    plugin: Arc<dyn Plugin>,
    handle: tokio::runtime::Handle,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl InstanceFfi for Instance {
    fn invoke(&self, function: RString, payload: RString) -> FfiFuture<RResult<RString, RString>> {
        let plugin = Arc::clone(&self.plugin);
        let (reply, answer) = futures::channel::oneshot::channel();
        self.handle.spawn(async move {
            let outcome = call_plugin(plugin, function.into_string(), payload).await;
            let _ = reply.send(outcome);
        });
        async move {
            let outcome = answer
                .await
                .unwrap_or_else(|_| Err(ErrorBody::internal("the plugin dropped the call")));
            match outcome {
                Ok(value) => RResult::ROk(value.to_string().into()),
                Err(body) => RResult::RErr(body.to_json().into()),
            }
        }
        .into_ffi()
    }

    fn shutdown(&self) {
        let plugin = Arc::clone(&self.plugin);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let _context = self.handle.enter();
            plugin.shutdown();
        }));
        let runtime = self.runtime.lock().ok().and_then(|mut slot| slot.take());
        if let Some(runtime) = runtime {
            runtime.shutdown_timeout(RUNTIME_SHUTDOWN_GRACE);
        }
    }
}

async fn call_plugin(
    plugin: Arc<dyn Plugin>,
    function: String,
    payload: RString,
) -> Result<Value, ErrorBody> {
    let parsed = serde_json::from_str(payload.as_str());
    // The text is not needed once parsed: a large request is not held twice while it runs.
    drop(payload);
    let payload: Value = parsed.map_err(|e| {
        ErrorBody::internal(format!("payload crossed the boundary as bad JSON: {e}"))
    })?;
    let future = catch_unwind(AssertUnwindSafe(|| plugin.invoke(function, payload)))
        .map_err(|panic| ErrorBody::internal(format!("plugin panicked: {}", panic_text(&panic))))?;
    AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(ErrorBody::internal(format!(
                "plugin panicked: {}",
                panic_text(&panic)
            )))
        })
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
