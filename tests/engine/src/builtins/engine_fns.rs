//! `engine::workers::list`, `engine::functions::list`, `engine::functions::info`,
//! `engine::channels::create`.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{input, BUILTINS};
use crate::functions::FunctionEntry;
use crate::state::State;
use crate::wire::{ErrorBody, DEFAULT_NAMESPACE};
use crate::worker::now_ms;

/// Each worker with every field of the SDK's `WorkerInfo`, plus namespace, pid, description.
pub fn workers_list(state: &State) -> Value {
    let workers: Vec<Value> = state
        .workers
        .sorted()
        .into_iter()
        .map(|w| {
            let identity = w.identity.clone().unwrap_or_default();
            let functions: Vec<&str> = state
                .functions
                .owned_by(&w.id)
                .into_iter()
                .map(|e| e.def.id.as_str())
                .collect();
            json!({
                "id": w.id,
                "name": identity.name,
                "description": identity.description,
                "namespace": w.identity.as_ref().map(|i| i.namespace()),
                "runtime": identity.runtime,
                "version": identity.version,
                "os": identity.os,
                "pid": identity.pid,
                "isolation": identity.isolation,
                "ip_address": w.ip_address,
                "status": "connected",
                "connected_at_ms": w.connected_at_ms,
                "function_count": functions.len(),
                "functions": functions,
                "active_invocations": state.pending.in_flight_for(&w.id),
            })
        })
        .collect();
    json!({ "workers": workers, "timestamp": now_ms() })
}

#[derive(Deserialize)]
struct ListInput {
    #[serde(default)]
    include_internal: Option<bool>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
}

pub fn functions_list(state: &State, data: Value) -> Result<Value, ErrorBody> {
    let input: ListInput = input("engine::functions::list", data)?;
    let prefix = input.prefix.unwrap_or_default();
    let mut functions: Vec<Value> = state
        .functions
        .all()
        .filter(|e| {
            input
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == e.namespace)
        })
        .filter(|e| e.def.id.starts_with(&prefix))
        .map(|e| entry_info(state, e))
        .collect();
    if input.include_internal.unwrap_or(false) {
        functions.extend(
            BUILTINS
                .iter()
                .filter(|(id, _)| id.starts_with(&prefix))
                .map(|(id, description)| builtin_info(id, description)),
        );
    }
    Ok(json!({ "functions": functions }))
}

#[derive(Deserialize)]
struct InfoInput {
    function_id: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// One function's detail. The schemas appear both as `request_format`/`response_format` (the
/// SDK's `FunctionInfo`) and as `request_schema`/`response_schema` (the engine's detail view).
pub fn functions_info(state: &State, data: Value) -> Result<Value, ErrorBody> {
    let input: InfoInput = input("engine::functions::info", data)?;
    let id = input.function_id;
    if let Some(entry) = state.functions.find(input.namespace.as_deref(), &id) {
        let mut info = entry_info(state, entry);
        if let Some(map) = info.as_object_mut() {
            map.insert("request_schema".into(), json!(entry.def.request_format));
            map.insert("response_schema".into(), json!(entry.def.response_format));
            map.insert("registered_triggers".into(), json!([]));
        }
        return Ok(info);
    }
    if let Some((id, description)) = BUILTINS.iter().find(|(b, _)| *b == id) {
        return Ok(builtin_info(id, description));
    }
    Err(ErrorBody::new(
        "NOT_FOUND",
        format!("Function '{id}' is not registered."),
    ))
}

#[derive(Deserialize)]
struct CreateChannelInput {
    #[serde(default)]
    buffer_size: Option<usize>,
}

pub fn channels_create(state: &mut State, data: Value) -> Result<Value, ErrorBody> {
    let input: CreateChannelInput = input("engine::channels::create", data)?;
    Ok(state.channels.create(input.buffer_size))
}

fn entry_info(state: &State, entry: &FunctionEntry) -> Value {
    let owner_name = state.workers.get(&entry.owner).and_then(|w| w.name());
    entry.info(owner_name)
}

fn builtin_info(id: &str, description: &str) -> Value {
    json!({
        "function_id": id,
        "namespace": DEFAULT_NAMESPACE,
        "description": description,
        "request_format": null,
        "response_format": null,
        "metadata": {"internal": true},
        "worker_id": null,
        "worker_name": "iii-engine-functions",
    })
}
