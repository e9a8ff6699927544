//! A worker's life on the bus: connect, register functions (held until its namespace is
//! known), announce itself, reattach, disconnect.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::functions::{FunctionDef, Registered};
use crate::http_function::HttpTarget;
use crate::state::{SharedRef, State};
use crate::wire::{self, ErrorBody};
use crate::worker::{Identity, Outgoing, Worker};

/// Adds a new connection and greets it with `workerregistered`; returns its worker id.
pub fn connect(
    shared: &SharedRef,
    ip_address: Option<String>,
    tx: mpsc::UnboundedSender<Outgoing>,
) -> String {
    let id = uuid::Uuid::new_v4().to_string();
    let worker = Worker::new(id.clone(), ip_address, tx);
    worker.send(&wire::worker_registered(&worker.id, &worker.reattach_token));
    shared.lock().workers.insert(worker);
    tracing::info!(worker_id = %id, "worker connected");
    id
}

/// Forgets a worker, its functions, and the calls it was serving (their callers get
/// `invocation_stopped`).
pub fn disconnect(state: &mut State, worker_id: &str) {
    if state.workers.remove(worker_id).is_none() {
        return;
    }
    state.functions.remove_owned_by(worker_id);
    state.triggers.disconnect(&state.workers, worker_id);
    for call in state.pending.drop_worker(worker_id) {
        let error = ErrorBody::new(
            wire::INVOCATION_STOPPED,
            format!(
                "Invocation stopped: worker {worker_id} disconnected before {} returned.",
                call.function_id
            ),
        );
        let frame =
            wire::invocation_result(&call.caller_invocation_id, &call.function_id, Err(error));
        state.workers.send(&call.caller, &frame);
    }
    tracing::info!(worker_id = %worker_id, "worker disconnected");
}

/// `registerfunction`: registers now when the namespace is known, else holds the definition
/// and starts the grace timer.
pub fn register_function(shared: &SharedRef, worker_id: &str, def: FunctionDef) {
    let mut state = shared.lock();
    let Some(worker) = state.workers.get_mut(worker_id) else {
        return;
    };
    let Some(namespace) = worker.registration_namespace().map(str::to_string) else {
        worker.held.retain(|held| held.id != def.id);
        worker.held.push(def);
        if worker.held.len() == 1 {
            start_grace_timer(shared, worker_id);
        }
        return;
    };
    register_in(&mut state, worker_id, &namespace, def);
}

/// `unregisterfunction`.
pub fn unregister_function(state: &mut State, worker_id: &str, id: &str) {
    if let Some(worker) = state.workers.get_mut(worker_id) {
        worker.held.retain(|held| held.id != id);
    }
    state.functions.unregister(worker_id, id);
}

/// Registers `def` in `namespace`. An HTTP-invoked function's URL is checked and its
/// credential read from the engine's environment now; a failure drops the registration with a
/// log line and no message to the worker, as the real engine does.
fn register_in(state: &mut State, worker_id: &str, namespace: &str, def: FunctionDef) {
    let id = def.id.clone();
    let http = match &def.invocation {
        None => None,
        Some(invocation) => match HttpTarget::prepare(invocation, &state.env, state.url_policy) {
            Ok(target) => Some(Arc::new(target)),
            Err(error) => {
                tracing::warn!(worker_id, namespace, function_id = %id, code = %error.code,
                    message = %error.message, "HTTP invocation function not registered");
                return;
            }
        },
    };
    match state.functions.register(namespace, worker_id, def, http) {
        Registered::Added | Registered::Replaced => {
            tracing::debug!(worker_id, namespace, function_id = %id, "function registered");
        }
        Registered::Conflict { owner } => {
            tracing::info!(worker_id, namespace, function_id = %id, "function id conflict");
            state
                .workers
                .send(worker_id, &wire::function_conflict(namespace, &id, &owner));
        }
    }
}

/// After the grace period, a worker that never announced itself registers in `default`.
fn start_grace_timer(shared: &SharedRef, worker_id: &str) {
    let shared = shared.clone();
    let worker_id = worker_id.to_string();
    let grace = shared.registration_grace;
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        let mut state = shared.lock();
        let Some(worker) = state.workers.get_mut(&worker_id) else {
            return;
        };
        if worker.identity.is_some() {
            return;
        }
        worker.grace_expired = true;
        let held = std::mem::take(&mut worker.held);
        tracing::info!(worker_id = %worker_id, "no engine::workers::register in time; using default");
        for def in held {
            register_in(&mut state, &worker_id, wire::DEFAULT_NAMESPACE, def);
        }
    });
}

/// What `engine::workers::register` reads. Field order matters: like the real engine's
/// input, it is a plain serde struct, so ARRAY data is read positionally in this order. The
/// engine stamps `_caller_worker_id` into object data only, which makes an array's first
/// element the worker id the announcement is applied to: a caller can name another
/// worker's connection. Fields without `#[serde(default)]` must be present in an array
/// (`null` will do); an object may leave any of them out.
#[derive(Debug, Clone, Deserialize)]
struct RegisterWorkerInput {
    #[serde(rename = "_caller_worker_id")]
    worker_id: String,
    runtime: Option<String>,
    version: Option<String>,
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    os: Option<String>,
    // Read for its place in an array; this engine keeps no telemetry.
    #[allow(dead_code)]
    telemetry: Option<Value>,
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    isolation: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// `engine::workers::register`: records the identity of the worker named by
/// `_caller_worker_id` (the caller itself for object data), refuses a name another live
/// worker holds in the namespace by rejecting and closing THAT named worker's connection,
/// then releases its held registrations. Names and descriptions are sanitised first, as the
/// real engine does, so names differing only by control or bidi characters are one name.
pub fn register_worker(state: &mut State, data: Value) -> Result<Value, ErrorBody> {
    let input: RegisterWorkerInput = serde_json::from_value(data).map_err(|e| {
        ErrorBody::new(
            "INVALID_ARGUMENTS",
            format!("engine::workers::register: {e}"),
        )
    })?;
    if input
        .namespace
        .as_deref()
        .is_some_and(|ns| ns.trim().is_empty())
    {
        return Err(ErrorBody::new(
            wire::INVALID_NAMESPACE,
            format!(
                "namespace is empty: worker '{}' declared {:?}.",
                input.name.as_deref().unwrap_or("<unnamed>"),
                input.namespace.as_deref().unwrap_or_default()
            ),
        ));
    }
    let worker_id = input.worker_id.clone();
    let Some(worker) = state.workers.get(&worker_id) else {
        // The real engine logs and ignores an announcement for no live connection.
        tracing::debug!(worker_id = %worker_id, "engine::workers::register for no live worker");
        return Ok(serde_json::json!({ "success": true }));
    };
    let declared = input
        .namespace
        .clone()
        .unwrap_or_else(|| wire::DEFAULT_NAMESPACE.to_string());
    // A connection whose namespace is already fixed (announced before, or placed in
    // `default` by the grace timer) keeps it.
    let namespace = worker
        .registration_namespace()
        .map_or(declared, str::to_string);
    let name = input.name.clone().and_then(sanitize_worker_text);
    if let Some(name) = name.as_deref() {
        if let Some(holder) = state.workers.holder_of_name(name, &namespace, &worker_id) {
            let holder_id = holder.id.clone();
            tracing::info!(worker_id = %worker_id, name, namespace = %namespace, "worker name conflict");
            worker.send(&wire::worker_conflict(&namespace, name, &holder_id));
            worker.close();
            return Ok(serde_json::json!({ "success": false }));
        }
    }
    let identity = Identity {
        name,
        namespace: Some(namespace.clone()),
        runtime: Some(input.runtime.unwrap_or_else(|| "unknown".to_string())),
        version: input.version,
        os: input.os,
        pid: input.pid,
        description: input.description.and_then(sanitize_worker_text),
        isolation: input.isolation,
    };
    let Some(worker) = state.workers.get_mut(&worker_id) else {
        return Ok(serde_json::json!({ "success": true }));
    };
    worker.identity = Some(identity);
    let held = std::mem::take(&mut worker.held);
    for def in held {
        register_in(state, &worker_id, &namespace, def);
    }
    Ok(serde_json::json!({ "success": true }))
}

/// Longest worker name or description kept, in characters (the real engine's bound).
const WORKER_TEXT_MAX_CHARS: usize = 280;

/// Worker text as the real engine stores it: C0/C1/DEL controls, the bidi embedding,
/// override and isolate characters and the line/paragraph separators dropped, at most
/// [`WORKER_TEXT_MAX_CHARS`] characters, trimmed; `None` when nothing is left.
pub fn sanitize_worker_text(raw: String) -> Option<String> {
    let cleaned: String = raw
        .chars()
        .filter(|c| {
            !(c.is_control()
                || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}'))
        })
        .take(WORKER_TEXT_MAX_CHARS)
        .collect();
    let trimmed = cleaned.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_string())
}

/// `reattach`: retires the previous connection of this worker when the token matches.
pub fn reattach(state: &mut State, worker_id: &str, previous: &str, token: Option<&str>) {
    if previous == worker_id {
        return;
    }
    let matches = state
        .workers
        .get(previous)
        .is_some_and(|old| Some(old.reattach_token.as_str()) == token);
    if !matches {
        tracing::debug!(
            worker_id,
            previous,
            "reattach ignored: unknown worker or wrong token"
        );
        return;
    }
    if let Some(old) = state.workers.get(previous) {
        old.close();
    }
    disconnect(state, previous);
    tracing::info!(
        worker_id,
        previous,
        "previous connection retired by reattach"
    );
}
