//! What the shell offers its plugin beyond calls: other functions on the bus (for instance
//! `engine::channels::create`, which `fs::read` and `fs::write` need for large content) and
//! the engine's address (where channel WebSockets connect).
//!
//! The shell implements [`HostServices`]; the plugin receives a [`Host`]. Across the boundary
//! a call is spawned on the shell's own runtime and its result comes back through a
//! runtime-agnostic channel: a cdylib has its own copy of tokio, so a future made by the
//! shell's tokio can never be polled on the plugin's threads.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use abi_stable::std_types::{RResult, RString};
use async_ffi::{FfiFuture, FutureExt as _};
use serde_json::Value;

use crate::ffi::{HostBox, HostFfi, HostFfi_TO};

pub type HostFuture = Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;

/// The shell's side.
pub trait HostServices: Send + Sync + 'static {
    /// The engine's WebSocket address (`ws://host:port`).
    fn engine_url(&self) -> String;

    /// Calls `function_id` on the bus.
    fn invoke(&self, function_id: String, payload: Value, timeout: Duration) -> HostFuture;
}

/// The plugin's side: cheap to clone.
#[derive(Clone)]
pub struct Host(Inner);

#[derive(Clone)]
enum Inner {
    /// The shell's services across the boundary.
    Ffi(Arc<HostBox>),
    /// Services in the same binary (tests).
    Local(Arc<dyn HostServices>),
    None,
}

impl Host {
    /// A host with no services: every call fails with a clear reason (plugins in unit tests).
    pub fn none() -> Self {
        Host(Inner::None)
    }

    /// Services living in the same binary as the plugin (tests that run a plugin in process).
    pub fn local(services: Arc<dyn HostServices>) -> Self {
        Host(Inner::Local(services))
    }

    pub(crate) fn from_ffi(host: HostBox) -> Self {
        Host(Inner::Ffi(Arc::new(host)))
    }

    /// The engine's WebSocket address, if the plugin runs under a shell.
    pub fn engine_url(&self) -> Option<String> {
        match &self.0 {
            Inner::Ffi(host) => Some(host.engine_url().into_string()),
            Inner::Local(services) => Some(services.engine_url()),
            Inner::None => None,
        }
    }

    /// Calls `function_id` on the bus; the error is one line.
    pub async fn invoke(
        &self,
        function_id: &str,
        payload: &Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        match &self.0 {
            Inner::Ffi(host) => {
                let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                let answer = host
                    .invoke(function_id.into(), payload.to_string().into(), millis)
                    .await;
                match answer {
                    RResult::ROk(text) => serde_json::from_str(text.as_str())
                        .map_err(|e| format!("{function_id} answered with bad JSON: {e}")),
                    RResult::RErr(reason) => Err(reason.into_string()),
                }
            }
            Inner::Local(services) => {
                services
                    .invoke(function_id.to_string(), payload.clone(), timeout)
                    .await
            }
            Inner::None => Err(format!(
                "cannot call {function_id}: this plugin runs without a shell"
            )),
        }
    }
}

/// Wraps the shell's services for the boundary; calls run on the runtime of `handle` (the
/// shell's).
pub(crate) fn to_ffi(services: Arc<dyn HostServices>, handle: tokio::runtime::Handle) -> HostBox {
    HostFfi_TO::from_value(
        ShellHost { services, handle },
        abi_stable::sabi_trait::TD_Opaque,
    )
}

struct ShellHost {
    services: Arc<dyn HostServices>,
    handle: tokio::runtime::Handle,
}

impl HostFfi for ShellHost {
    fn engine_url(&self) -> RString {
        self.services.engine_url().into()
    }

    fn invoke(
        &self,
        function_id: RString,
        payload: RString,
        timeout_ms: u64,
    ) -> FfiFuture<RResult<RString, RString>> {
        let services = Arc::clone(&self.services);
        let (reply, answer) = futures::channel::oneshot::channel();
        self.handle.spawn(async move {
            let outcome = match serde_json::from_str(payload.as_str()) {
                Ok(payload) => {
                    services
                        .invoke(
                            function_id.into_string(),
                            payload,
                            Duration::from_millis(timeout_ms),
                        )
                        .await
                }
                Err(e) => Err(format!("payload crossed the boundary as bad JSON: {e}")),
            };
            let _ = reply.send(outcome);
        });
        async move {
            match answer.await {
                Ok(Ok(value)) => RResult::ROk(value.to_string().into()),
                Ok(Err(reason)) => RResult::RErr(reason.into()),
                Err(_) => RResult::RErr("the shell dropped the call".into()),
            }
        }
        .into_ffi()
    }
}
