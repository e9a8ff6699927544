//! What the shell offers its plugin ([`plugin_api::HostServices`]): calls to other functions
//! on the bus through our own engine connection (the plugin has none), and the engine's
//! address for channel WebSockets.

use std::time::Duration;

use iii_sdk::protocol::TriggerRequest;
use iii_sdk::IIIClient;
use plugin_api::services::HostFuture;
use plugin_api::HostServices;
use serde_json::Value;

pub struct EngineServices {
    pub iii: IIIClient,
    pub url: String,
}

impl HostServices for EngineServices {
    fn engine_url(&self) -> String {
        self.url.clone()
    }

    fn invoke(&self, function_id: String, payload: Value, timeout: Duration) -> HostFuture {
        let iii = self.iii.clone();
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
}
