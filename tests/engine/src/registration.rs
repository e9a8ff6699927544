//! A worker's life on the bus: connect, register functions (held until its namespace is
//! known), announce itself, reattach, disconnect.

use serde_json::Value;
use tokio::sync::mpsc;

use crate::functions::{FunctionDef, Registered};
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

fn register_in(state: &mut State, worker_id: &str, namespace: &str, def: FunctionDef) {
    let id = def.id.clone();
    match state.functions.register(namespace, worker_id, def) {
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

/// `engine::workers::register`: records the identity, refuses a name already live in the
/// namespace (and closes that connection), then releases held registrations.
pub fn register_worker(
    state: &mut State,
    worker_id: &str,
    data: Value,
) -> Result<Value, ErrorBody> {
    let identity: Identity = serde_json::from_value(data).map_err(|e| {
        ErrorBody::new(
            "INVALID_ARGUMENTS",
            format!("engine::workers::register: {e}"),
        )
    })?;
    let namespace = identity.namespace().to_string();
    if let Some(name) = identity.name.as_deref() {
        if let Some(holder) = state.workers.holder_of_name(name, &namespace, worker_id) {
            let holder_id = holder.id.clone();
            tracing::info!(worker_id, name, namespace = %namespace, "worker name conflict");
            if let Some(worker) = state.workers.get(worker_id) {
                worker.send(&wire::worker_conflict(&namespace, name, &holder_id));
                worker.close();
            }
            return Err(ErrorBody::new(
                wire::WORKER_NAMESPACE_CONFLICT,
                format!("Worker '{name}' is already connected in namespace {namespace}."),
            ));
        }
    }
    let Some(worker) = state.workers.get_mut(worker_id) else {
        return Ok(serde_json::json!({ "success": true }));
    };
    worker.identity = Some(identity);
    let held = std::mem::take(&mut worker.held);
    for def in held {
        register_in(state, worker_id, &namespace, def);
    }
    Ok(serde_json::json!({ "success": true }))
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
