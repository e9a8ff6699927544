//! Registering the plugin's functions on the bus (its own under its prefix, its family
//! functions under `sandbox::provider::<name>::`, and the event trigger types) and serving
//! their calls.

use std::sync::Arc;

use iii_sdk::runtime::FunctionRef;
use iii_sdk::{Error as SdkError, IIIClient, RegisterFunction};
use plugin_api::host::PluginInstance;
use plugin_api::manifest::{family_call, family_function_id};
use plugin_api::{ErrorBody, FunctionSpec};
use serde_json::Value;
use tracing::Instrument;

use crate::auth::WorkerToken;

/// What every call handler shares.
pub struct Dispatcher {
    pub plugin: PluginInstance,
    pub token: WorkerToken,
    pub trace_payloads: bool,
    /// iii's sandbox family surface, when it is on.
    pub family: Option<Family>,
}

/// The plugin's family functions and the provider name they are registered under
/// (`sandbox::provider::<name>::<id>`, see `plugin_api::manifest`).
pub struct Family {
    pub name: String,
    pub functions: Vec<FunctionSpec>,
}

/// The function every plugin serves; registered last, so a caller (or a test) that finds it
/// on the bus can call every other function too: registrations travel in order on our one
/// connection.
const READINESS_FUNCTION: &str = "adapter::info";

/// Registers `<prefix>::<id>` for every function of the manifest, then the family functions
/// (`sandbox::provider::<name>::<id>`, when the dispatcher has a family), and
/// `<prefix>::adapter::info` last; returns them in that order, so a connection handing its
/// functions over can withdraw them.
pub fn register_all(
    iii: &IIIClient,
    prefix: &str,
    functions: &[FunctionSpec],
    dispatcher: Arc<Dispatcher>,
) -> Vec<FunctionRef> {
    // The event trigger types first, so they are in place once the readiness function shows.
    let family_name = dispatcher.family.as_ref().map(|f| f.name.as_str());
    crate::events::register(iii, &dispatcher.plugin, prefix, family_name);
    let (marker, rest): (Vec<_>, Vec<_>) = functions
        .iter()
        .partition(|spec| spec.id == READINESS_FUNCTION);
    let ours = |spec: &FunctionSpec| {
        (
            format!("{prefix}::{}", spec.id),
            spec.id.clone(),
            spec.clone(),
        )
    };
    let family = dispatcher.family.iter().flat_map(|family| {
        family.functions.iter().map(|spec| {
            (
                family_function_id(&family.name, &spec.id),
                family_call(&spec.id),
                spec.clone(),
            )
        })
    });
    let table: Vec<(String, String, FunctionSpec)> = rest
        .into_iter()
        .map(ours)
        .chain(family)
        .chain(marker.into_iter().map(ours))
        .collect();
    table
        .into_iter()
        .map(|(full_id, call, spec)| register_one(iii, full_id, call, &spec, &dispatcher))
        .collect()
}

/// Registers `full_id`, whose calls reach the plugin as `call`.
fn register_one(
    iii: &IIIClient,
    full_id: String,
    call: String,
    spec: &FunctionSpec,
    dispatcher: &Arc<Dispatcher>,
) -> FunctionRef {
    let call: Arc<str> = call.into();
    let guarded = spec.token_guarded;
    let dispatcher = Arc::clone(dispatcher);
    let handler = move |payload: Value| {
        let dispatcher = Arc::clone(&dispatcher);
        let call = Arc::clone(&call);
        async move { dispatcher.call(&call, guarded, payload).await }
    };
    let registration = RegisterFunction::new_async(handler)
        .description(spec.description.clone())
        .request_format(spec.request_schema.clone())
        .response_format(spec.response_schema.clone());
    let registered = iii.register_function(full_id.clone(), registration);
    tracing::debug!(function = %full_id, guarded, "registered");
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
