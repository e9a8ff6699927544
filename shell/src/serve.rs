//! Registering the plugin's functions on the bus and serving their calls.

use std::sync::Arc;

use iii_sdk::runtime::FunctionRef;
use iii_sdk::{Error as SdkError, IIIClient, RegisterFunction};
use plugin_api::host::PluginInstance;
use plugin_api::{ErrorBody, FunctionSpec};
use serde_json::Value;
use tracing::Instrument;

use crate::auth::WorkerToken;

/// What every call handler shares.
pub struct Dispatcher {
    pub plugin: PluginInstance,
    pub token: WorkerToken,
    pub trace_payloads: bool,
}

/// The function every plugin serves; registered last, so a caller (or a test) that finds it
/// on the bus can call every other function too: registrations travel in order on our one
/// connection.
const READINESS_FUNCTION: &str = "adapter::info";

/// Registers `<prefix>::<id>` for every function of the manifest, `adapter::info` last;
/// returns them in that order, so a connection handing its functions over can withdraw them.
pub fn register_all(
    iii: &IIIClient,
    prefix: &str,
    functions: &[FunctionSpec],
    dispatcher: Arc<Dispatcher>,
) -> Vec<FunctionRef> {
    let mut registered = Vec::with_capacity(functions.len());
    let (marker, rest): (Vec<_>, Vec<_>) = functions
        .iter()
        .partition(|spec| spec.id == READINESS_FUNCTION);
    for spec in rest.into_iter().chain(marker) {
        let full_id = format!("{prefix}::{}", spec.id);
        let suffix: Arc<str> = spec.id.as_str().into();
        let guarded = spec.token_guarded;
        let dispatcher = Arc::clone(&dispatcher);
        let handler = move |payload: Value| {
            let dispatcher = Arc::clone(&dispatcher);
            let suffix = Arc::clone(&suffix);
            async move { dispatcher.call(&suffix, guarded, payload).await }
        };
        let registration = RegisterFunction::new_async(handler)
            .description(spec.description.clone())
            .request_format(spec.request_schema.clone())
            .response_format(spec.response_schema.clone());
        registered.push(iii.register_function(full_id.clone(), registration));
        tracing::debug!(function = %full_id, guarded, "registered");
    }
    registered
}

impl Dispatcher {
    async fn call(
        &self,
        function: &str,
        guarded: bool,
        mut payload: Value,
    ) -> Result<Value, SdkError> {
        let span = tracing::info_span!("invoke", function);
        async move {
            if guarded {
                self.token
                    .check_and_strip(&mut payload)
                    .map_err(to_sdk_error)?;
            }
            if self.trace_payloads {
                tracing::debug!(%payload, "request");
            }
            // The JSON text is what crosses to the plugin; the `Value` goes before the call
            // runs, so a large request is held once (the plugin frees the text once parsed).
            let text = payload.to_string();
            drop(payload);
            let outcome = self.plugin.invoke_json(function, text).await;
            match &outcome {
                Ok(result) if self.trace_payloads => tracing::debug!(%result, "result"),
                Ok(_) => {}
                Err(body) => tracing::info!(code = %body.code, "failed"),
            }
            outcome.map_err(to_sdk_error)
        }
        .instrument(span)
        .await
    }
}

/// The bus error: the S-code as `code`, the whole body as JSON in `message` (SPEC.md 4).
fn to_sdk_error(body: ErrorBody) -> SdkError {
    SdkError::Remote {
        code: body.code.clone(),
        message: body.to_json(),
        stacktrace: None,
    }
}
