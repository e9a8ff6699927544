//! A stand-in for iii's `sandbox` router, written from the family's ABI (v0 of `iii-hq/workers`'
//! `sandbox-CONTEXT.md`): a worker that owns `sandbox::<leaf>` for the ABI's leaves, takes the
//! provider from the payload's `provider` (absent or empty: its default), removes that field,
//! and calls `sandbox::provider::<name>::<leaf>` with the rest. No adapter under that name is
//! `[S600] unknown provider`; any other failure is `[S502] forward ... failed: <the adapter's
//! error>`, so the adapter's own S-code and JSON body reach the caller inside that text.

use std::time::Duration;

use iii_sdk::protocol::TriggerRequest;
use iii_sdk::{Error, IIIClient, InitOptions, RegisterFunction};
use serde_json::Value;

/// The leaves the router serves: the ABI's lifecycle floor and its optional functions.
pub const LEAVES: &[&str] = &[
    "create",
    "exec",
    "stop",
    "list",
    "snapshot",
    "expose_port",
    "branch",
    "fs::read",
    "fs::write",
];

/// How long the router waits for an adapter (a create may pull an image).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(300);

/// The router, connected to the engine at `url`; it serves until dropped or shut down.
pub fn start(url: &str, default_provider: &str) -> IIIClient {
    let metadata = iii_sdk::runtime::WorkerMetadata {
        name: "sandbox".into(),
        ..Default::default()
    };
    let router = iii_sdk::register_worker(
        url,
        InitOptions {
            metadata: Some(metadata),
            identity: iii_sdk::WorkerIdentityMode::Explicit,
            ..Default::default()
        },
    );
    for leaf in LEAVES {
        let iii = router.clone();
        let default_provider = default_provider.to_string();
        router.register_function(
            format!("sandbox::{leaf}"),
            RegisterFunction::new_async(move |payload: Value| {
                let iii = iii.clone();
                let default_provider = default_provider.clone();
                async move { forward(&iii, &default_provider, leaf, payload).await }
            }),
        );
    }
    router
}

/// The provider a call names: `provider` when it is a non-empty string, else the default.
fn provider(payload: &Value, default_provider: &str) -> String {
    payload
        .get("provider")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .unwrap_or(default_provider)
        .to_string()
}

async fn forward(
    iii: &IIIClient,
    default_provider: &str,
    leaf: &str,
    mut payload: Value,
) -> Result<Value, Error> {
    let name = provider(&payload, default_provider);
    if let Some(fields) = payload.as_object_mut() {
        fields.remove("provider");
    }
    let target = format!("sandbox::provider::{name}::{leaf}");
    let request = TriggerRequest {
        function_id: target.clone(),
        payload,
        action: None,
        timeout_ms: Some(FORWARD_TIMEOUT.as_millis() as u64),
    };
    iii.trigger(request).await.map_err(|e| match &e {
        Error::Remote { code, .. } if code == "function_not_found" => Error::Handler(format!(
            "[S600] unknown provider: {name}: no adapter registered for {target}"
        )),
        _ => Error::Handler(format!("[S502] forward to {target} failed: {e}")),
    })
}
