//! What the shell offers its plugin ([`plugin_api::HostServices`]): calls to other functions
//! on the bus through our own engine connection (the plugin has none), the engine's address
//! for channel WebSockets, and the state of that connection for `adapter::info`.
//!
//! The connection is the one serving at the moment: after start-up the shell replaces a client
//! the engine refused (see `bus`), and the plugin's calls follow it.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use iii_sdk::protocol::TriggerRequest;
use iii_sdk::IIIClient;
use plugin_api::services::HostFuture;
use plugin_api::HostServices;
use serde_json::Value;

use crate::bus::BusStatus;

pub struct EngineServices {
    current: RwLock<IIIClient>,
    pub url: String,
    pub status: Arc<BusStatus>,
}

impl EngineServices {
    pub fn new(iii: IIIClient, url: String, status: Arc<BusStatus>) -> Self {
        Self {
            current: RwLock::new(iii),
            url,
            status,
        }
    }

    /// The client serving now (cheap: a client is a shared handle).
    pub fn current(&self) -> IIIClient {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes `iii` the client later plugin calls go through; calls already sent stay on the
    /// client they were sent on.
    pub fn replace(&self, iii: IIIClient) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = iii;
    }
}

impl HostServices for EngineServices {
    fn engine_url(&self) -> String {
        self.url.clone()
    }

    fn invoke(&self, function_id: String, payload: Value, timeout: Duration) -> HostFuture {
        let iii = self.current();
        Box::pin(async move {
            let request = TriggerRequest {
                function_id: function_id.clone(),
                payload,
                action: None,
                timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            };
            iii.trigger(request)
                .await
                .map_err(|e| format!("{function_id}: {e}"))
        })
    }

    fn bus_state(&self) -> Option<Value> {
        Some(self.status.to_json())
    }
}
