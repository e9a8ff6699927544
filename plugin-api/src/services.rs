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

    /// The state of the shell's connection to the engine (a JSON object the shell defines),
    /// or `None` when it keeps none: a plugin shows it, it does not interpret it.
    fn bus_state(&self) -> Option<Value> {
        None
    }
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

    /// The state of the shell's connection to the engine, when the shell reports one.
    pub fn bus_state(&self) -> Option<Value> {
        match &self.0 {
            Inner::Ffi(host) => {
                let text = host.bus_state();
                if text.is_empty() {
                    return None;
                }
                serde_json::from_str(text.as_str()).ok()
            }
            Inner::Local(services) => services.bus_state(),
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

    fn bus_state(&self) -> RString {
        self.services
            .bus_state()
            .map(|state| state.to_string().into())
            .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Services(Option<Value>);

    impl HostServices for Services {
        fn engine_url(&self) -> String {
            "ws://127.0.0.1:1".into()
        }

        fn invoke(&self, function_id: String, _: Value, _: Duration) -> HostFuture {
            Box::pin(async move { Err(format!("{function_id}: not in this test")) })
        }

        fn bus_state(&self) -> Option<Value> {
            self.0.clone()
        }
    }

    /// A shell that leaves `bus_state` at its default.
    struct Silent;

    impl HostServices for Silent {
        fn engine_url(&self) -> String {
            String::new()
        }

        fn invoke(&self, _: String, _: Value, _: Duration) -> HostFuture {
            Box::pin(async { Ok(Value::Null) })
        }
    }

    #[tokio::test]
    async fn the_bus_state_crosses_the_boundary_as_the_shell_reports_it() {
        let state = serde_json::json!({"state": "name_conflict", "reconnects": 2});
        let services: Arc<dyn HostServices> = Arc::new(Services(Some(state.clone())));
        let host = Host::from_ffi(to_ffi(services.clone(), tokio::runtime::Handle::current()));
        assert_eq!(host.bus_state(), Some(state.clone()));
        assert_eq!(Host::local(services).bus_state(), Some(state));
    }

    #[tokio::test]
    async fn a_shell_that_reports_no_bus_state_gives_none() {
        let host = Host::from_ffi(to_ffi(Arc::new(Silent), tokio::runtime::Handle::current()));
        assert_eq!(host.bus_state(), None);
        assert_eq!(Host::none().bus_state(), None);
        let services: Arc<dyn HostServices> = Arc::new(Services(None));
        assert_eq!(Host::local(services).bus_state(), None);
    }
}
