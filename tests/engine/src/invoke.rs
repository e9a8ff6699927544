//! Calls: route an `invokefunction` to a built-in or to the owning worker, and route the
//! owner's `invocationresult` back to the caller.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::builtins;
use crate::http_function::HttpTarget;
use crate::pending::PendingCall;
use crate::state::{SharedRef, State};
use crate::wire::{self, ErrorBody};

/// What a call names, taken from the frame.
pub struct Call {
    pub invocation_id: Option<String>,
    pub function_id: String,
    pub namespace: Option<String>,
}

/// A call the engine serves itself over HTTP: sent by [`spawn_http`] outside the state lock.
pub struct HttpCall {
    target: Arc<HttpTarget>,
    caller: String,
    /// `None` for fire-and-forget: the request is still sent, nobody hears the answer.
    caller_invocation_id: Option<String>,
    function_id: String,
    data: Value,
}

/// Handles one `invokefunction` from `caller`; `raw` is the frame as received. A call to an
/// HTTP-invoked function comes back as an [`HttpCall`] for the caller to spawn.
pub fn invoke(state: &mut State, caller: &str, call: Call, mut raw: Value) -> Option<HttpCall> {
    let Call {
        invocation_id,
        function_id,
        namespace,
    } = call;
    let reply = |state: &State, outcome: Result<Value, ErrorBody>| {
        if let Some(id) = &invocation_id {
            let frame = wire::invocation_result(id, &function_id, outcome);
            state.workers.send(caller, &frame);
        }
    };

    if builtins::is_builtin(&function_id) {
        // Built-ins consume the data; forwarded calls keep the frame untouched. Like every
        // call, object data carries the caller's id, stamped over whatever the caller wrote.
        let mut data = raw.get_mut("data").map(Value::take).unwrap_or(Value::Null);
        if let Some(object) = data.as_object_mut() {
            object.insert(
                "_caller_worker_id".into(),
                Value::String(caller.to_string()),
            );
        }
        if let Some(outcome) = builtins::call(state, &function_id, data) {
            reply(state, outcome);
            return None;
        }
    }

    let namespace = namespace.unwrap_or_else(|| wire::DEFAULT_NAMESPACE.to_string());
    let Some((owner, http)) = state
        .functions
        .get(&namespace, &function_id)
        .map(|entry| (entry.owner.clone(), entry.http.clone()))
    else {
        let message = format!("Function {function_id} not found in namespace {namespace}.");
        reply(
            state,
            Err(ErrorBody::new(wire::FUNCTION_NOT_FOUND, message)),
        );
        return None;
    };

    stamp_caller(state, caller, &mut raw);
    if let Some(target) = http {
        return Some(HttpCall {
            target,
            caller: caller.to_string(),
            caller_invocation_id: invocation_id,
            function_id,
            data: raw.get_mut("data").map(Value::take).unwrap_or(Value::Null),
        });
    }
    let leg_id = invocation_id.as_ref().map(|id| {
        state.pending.insert(PendingCall {
            caller: caller.to_string(),
            caller_invocation_id: id.clone(),
            owner: owner.clone(),
            function_id: function_id.clone(),
        })
    });
    if let (Some(leg_id), Some(frame)) = (&leg_id, raw.as_object_mut()) {
        frame.insert("invocation_id".into(), Value::String(leg_id.clone()));
    }
    if !state.workers.send(&owner, &raw) {
        // The owner's queue is closed: it is going away and will not answer.
        if let Some(leg_id) = leg_id {
            state.pending.complete(&leg_id, &owner);
            let message = format!("Invocation stopped: worker {owner} is disconnecting.");
            reply(
                state,
                Err(ErrorBody::new(wire::INVOCATION_STOPPED, message)),
            );
        }
    }
    None
}

/// Sends an HTTP-invoked call from the engine's host and answers the caller, if it waits.
pub fn spawn_http(shared: &SharedRef, call: HttpCall) {
    let shared = shared.clone();
    tokio::spawn(async move {
        let request_id = call
            .caller_invocation_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let outcome = call
            .target
            .call(&call.function_id, &request_id, &call.data)
            .await;
        if let Err(error) = &outcome {
            tracing::debug!(function_id = %call.function_id, code = %error.code, "HTTP invocation failed");
        }
        if let Some(id) = &call.caller_invocation_id {
            let frame = wire::invocation_result(id, &call.function_id, outcome);
            shared.lock().workers.send(&call.caller, &frame);
        }
    });
}

/// Adds `_caller_worker_id` to object data, and the engine-stamped half of `caller`.
fn stamp_caller(state: &State, caller: &str, raw: &mut Value) {
    let Some(frame) = raw.as_object_mut() else {
        return;
    };
    if let Some(data) = frame.get_mut("data").and_then(Value::as_object_mut) {
        data.insert(
            "_caller_worker_id".into(),
            Value::String(caller.to_string()),
        );
    }
    let name = state
        .workers
        .get(caller)
        .and_then(|w| w.name())
        .map(str::to_string);
    let stamped = frame
        .entry("caller")
        .or_insert_with(|| Value::Object(Map::new()));
    if !stamped.is_object() {
        *stamped = Value::Object(Map::new());
    }
    if let Some(stamped) = stamped.as_object_mut() {
        stamped.insert("worker_id".into(), Value::String(caller.to_string()));
        if let Some(name) = name {
            stamped.insert("worker_name".into(), Value::String(name));
        }
    }
}

/// Handles one `invocationresult` from `owner`: forwarded unchanged but for the caller's id.
pub fn complete(state: &mut State, owner: &str, leg_id: &str, mut raw: Value) {
    let Some(call) = state.pending.complete(leg_id, owner) else {
        tracing::debug!(
            owner,
            invocation_id = leg_id,
            "result for no pending call; dropped"
        );
        return;
    };
    if let Some(frame) = raw.as_object_mut() {
        frame.insert(
            "invocation_id".into(),
            Value::String(call.caller_invocation_id.clone()),
        );
    }
    state.workers.send(&call.caller, &raw);
}
