//! The worker protocol's messages: what the engine reads from a worker and the frames it writes.
//!
//! Only the fields the engine acts on are named; everything else in a frame is kept in the raw
//! JSON so forwarded messages reach their peer unchanged. Unknown `type`s decode to
//! [`Inbound::Unknown`] and are ignored, as PROTOCOL.md asks.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::http_function::HttpInvocation;

/// Namespace used when a message or a worker names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Error code for a function id nobody registered.
pub const FUNCTION_NOT_FOUND: &str = "function_not_found";
/// Error code for a call whose owner went away before answering.
pub const INVOCATION_STOPPED: &str = "invocation_stopped";
/// Rejection code: the function id is held by another live worker in the namespace.
pub const FUNCTION_NAMESPACE_CONFLICT: &str = "FUNCTION_NAMESPACE_CONFLICT";
/// Rejection code: the worker name is held by another live worker in the namespace.
pub const WORKER_NAMESPACE_CONFLICT: &str = "WORKER_NAMESPACE_CONFLICT";
/// Error code: a namespace field was given and held nothing but whitespace.
pub const INVALID_NAMESPACE: &str = "INVALID_NAMESPACE";

/// A message a worker sends, reduced to what routing needs.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Inbound {
    RegisterFunction {
        id: String,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        request_format: Option<Value>,
        #[serde(default)]
        response_format: Option<Value>,
        #[serde(default)]
        metadata: Option<Value>,
        /// An HTTP-invoked function: the engine calls this endpoint itself. A malformed
        /// object makes the whole message malformed (ignored), as in the real engine.
        #[serde(default)]
        invocation: Option<HttpInvocation>,
    },
    UnregisterFunction {
        id: String,
    },
    InvokeFunction {
        #[serde(default)]
        invocation_id: Option<String>,
        function_id: String,
        #[serde(default)]
        namespace: Option<String>,
    },
    InvocationResult {
        invocation_id: String,
    },
    RegisterTriggerType {
        id: String,
        #[serde(default)]
        description: Option<String>,
    },
    UnregisterTriggerType {
        id: String,
    },
    /// Kept whole in the raw message: the owner receives its fields.
    RegisterTrigger,
    UnregisterTrigger {
        id: String,
    },
    TriggerRegistrationResult,
    Ping,
    Reattach {
        previous_worker_id: String,
        #[serde(default)]
        reattach_token: Option<String>,
    },
    #[serde(other)]
    Unknown,
}

/// An error as the protocol carries it in `invocationresult.error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }
}

/// Sent right after the upgrade.
pub fn worker_registered(worker_id: &str, reattach_token: &str) -> Value {
    json!({
        "type": "workerregistered",
        "worker_id": worker_id,
        "reattach_token": reattach_token,
    })
}

/// The engine's answer to a call it handled itself or could not route.
pub fn invocation_result(
    invocation_id: &str,
    function_id: &str,
    outcome: Result<Value, ErrorBody>,
) -> Value {
    match outcome {
        Ok(result) => json!({
            "type": "invocationresult",
            "invocation_id": invocation_id,
            "function_id": function_id,
            "result": result,
        }),
        Err(error) => json!({
            "type": "invocationresult",
            "invocation_id": invocation_id,
            "function_id": function_id,
            "error": error.to_json(),
        }),
    }
}

pub fn function_conflict(namespace: &str, function_id: &str, owner_worker_id: &str) -> Value {
    json!({
        "type": "registrationrejected",
        "code": FUNCTION_NAMESPACE_CONFLICT,
        "namespace": namespace,
        "function_id": function_id,
        "owner_worker_id": owner_worker_id,
    })
}

pub fn worker_conflict(namespace: &str, worker_name: &str, owner_worker_id: &str) -> Value {
    json!({
        "type": "registrationrejected",
        "code": WORKER_NAMESPACE_CONFLICT,
        "namespace": namespace,
        "worker_name": worker_name,
        "owner_worker_id": owner_worker_id,
    })
}

pub fn pong() -> Value {
    json!({ "type": "pong" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_types_decode_to_unknown() {
        let message: Inbound =
            serde_json::from_value(json!({"type": "observe", "id": "x"})).unwrap();
        assert!(matches!(message, Inbound::Unknown));
    }

    #[test]
    fn fire_and_forget_call_has_no_invocation_id() {
        let message: Inbound = serde_json::from_value(json!({
            "type": "invokefunction", "invocation_id": null,
            "function_id": "a::b", "data": {}, "action": {"type": "void"}
        }))
        .unwrap();
        match message {
            Inbound::InvokeFunction { invocation_id, .. } => assert!(invocation_id.is_none()),
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn trigger_messages_decode_with_all_their_fields() {
        let message: Inbound = serde_json::from_value(json!({
            "type": "registertrigger", "id": "t", "trigger_type": "a::event",
            "function_id": "f", "config": {"kinds": ["ready"]}, "namespace": "ns"
        }))
        .unwrap();
        assert!(matches!(message, Inbound::RegisterTrigger));
        let message: Inbound = serde_json::from_value(json!({
            "type": "triggerregistrationresult", "id": "t", "trigger_type": "a::event",
            "function_id": "f", "error": {"code": "c", "message": "m"}
        }))
        .unwrap();
        assert!(matches!(message, Inbound::TriggerRegistrationResult));
        let message: Inbound = serde_json::from_value(json!({
            "type": "unregistertrigger", "id": "t", "trigger_type": "a::event"
        }))
        .unwrap();
        assert!(matches!(message, Inbound::UnregisterTrigger { .. }));
    }

    #[test]
    fn error_result_carries_code_and_message() {
        let frame = invocation_result("i", "f", Err(ErrorBody::new("C", "M")));
        assert_eq!(frame["error"], json!({"code": "C", "message": "M"}));
        assert!(frame.get("result").is_none());
    }
}
