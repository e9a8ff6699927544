//! The lifecycle-event trigger types: `<prefix>::event`, and `sandbox::provider::<name>::event`
//! when the family surface is on. The engine forwards each binding of them to us (their
//! owner); we pass it on to the plugin, which keeps the subscribers and delivers the events
//! (see sandbox-core's `events` and docs/events.md).

use std::future::Future;
use std::pin::Pin;

use iii_sdk::trigger::{TriggerConfig, TriggerHandler};
use iii_sdk::{Error as SdkError, IIIClient, RegisterTriggerType};
use plugin_api::host::PluginInstance;
use plugin_api::manifest::family_function_id;
use serde_json::json;

/// The id leaf of the trigger type, after our prefix or the family's.
pub const LEAF: &str = "event";
/// The engine's namespace for a worker or binding that names none.
const DEFAULT_NAMESPACE: &str = "default";

const DESCRIPTION: &str = "Sandbox lifecycle events: created, ready, paused, resumed, stopped \
     {reason}, snapshot_created, forked, port_exposed, port_closed, exec_started, exec_ended, \
     worker_started, worker_exited. Config: {kinds?: [..], sandbox_id?: \"..\"}. Each event \
     {kind, sandbox_id, at, ...} carries ids, codes, sizes and times, never payloads or output. \
     See docs/events.md.";

/// Passes bindings of one of our trigger types to the plugin.
struct Bindings {
    plugin: PluginInstance,
    trigger_type: String,
    /// Our functions' prefix: events are never sent to them (the plugin refuses it).
    prefix: String,
    /// Our namespace (`default` when none): the one the plugin's calls resolve in.
    namespace: String,
}

type Answer<'a> = Pin<Box<dyn Future<Output = Result<(), SdkError>> + Send + 'a>>;

// Written out rather than through `async_trait`, which the shell does not otherwise need:
// these are the methods the macro would generate.
impl TriggerHandler for Bindings {
    fn register_trigger<'life0, 'async_trait>(
        &'life0 self,
        config: TriggerConfig,
    ) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            // The plugin calls the subscriber's function through our connection, so it
            // resolves in our namespace: a binding for another one would never be reached.
            let wanted = config.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
            if wanted != self.namespace {
                return Err(refusal(plugin_api::ErrorBody::new(
                    "S001",
                    "invalid_request",
                    format!(
                        "events are delivered to functions in namespace `{}`, the adapter's; \
                         this binding's function is in `{wanted}`",
                        self.namespace
                    ),
                )));
            }
            let payload = json!({
                "id": config.id,
                "function_id": config.function_id,
                "config": config.config,
                "trigger_type": self.trigger_type,
                "prefix": self.prefix,
            });
            self.plugin
                .invoke("events::subscribe", payload)
                .await
                .map(drop)
                .map_err(refusal)
        })
    }

    fn unregister_trigger<'life0, 'async_trait>(
        &'life0 self,
        config: TriggerConfig,
    ) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            self.plugin
                .invoke("events::unsubscribe", json!({"id": config.id}))
                .await
                .map(drop)
                .map_err(refusal)
        })
    }
}

/// The S-code body as the engine passes it to the subscriber (in the registration result's
/// message).
fn refusal(body: plugin_api::ErrorBody) -> SdkError {
    SdkError::Remote {
        code: body.code.clone(),
        message: body.to_json(),
        stacktrace: None,
    }
}

/// The trigger type ids we own: ours, then the family's when it is on.
pub fn trigger_types(prefix: &str, family: Option<&str>) -> Vec<String> {
    std::iter::once(format!("{prefix}::{LEAF}"))
        .chain(family.map(|name| family_function_id(name, LEAF)))
        .collect()
}

/// Registers our trigger types on `iii` (each new client needs them; a client that reconnects
/// registers them again itself).
pub fn register(iii: &IIIClient, plugin: &PluginInstance, prefix: &str, family: Option<&str>) {
    let namespace = iii
        .namespace()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    for id in trigger_types(prefix, family) {
        let handler = Bindings {
            plugin: plugin.clone(),
            trigger_type: id.clone(),
            prefix: prefix.to_string(),
            namespace: namespace.clone(),
        };
        // iii-sdk 0.25 marks trigger types deprecated in favour of observable functions; the
        // engines our users run still bind subscribers through `registertrigger`, which is
        // what a trigger type serves. The variant without the runtime warning is the one
        // iii's own trigger-providing crates use: the warning asks the reader to migrate code
        // an operator of this adapter does not own, on every start. The SDK is pinned
        // (`=0.25.0`), so the variant cannot change under us.
        #[allow(deprecated)]
        let _ = iii.register_trigger_type_without_warning(RegisterTriggerType::new(
            id.clone(),
            DESCRIPTION,
            handler,
        ));
        tracing::debug!(trigger_type = %id, "registered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ours_and_the_familys() {
        assert_eq!(
            trigger_types("sandbox-libkrun", None),
            ["sandbox-libkrun::event"]
        );
        assert_eq!(
            trigger_types("sandbox-libkrun", Some("libkrun")),
            [
                "sandbox-libkrun::event",
                "sandbox::provider::libkrun::event"
            ]
        );
    }
}
