//! The worker-protocol messages, as typed structs with exactly the fields the official SDKs
//! send (read in iii-sdk 0.25.0's `protocol.rs`/`iii.rs`, the Python SDK's `iii.py` and the
//! Node SDK's `iii.ts`), and the guard's own serialisation of each.
//!
//! A guest's message is read strictly: a key named twice anywhere, a field no SDK sends, a
//! value of the wrong type, an invocation id that is not a UUID make it malformed. What goes
//! on to the engine is always `serde_json::to_string` of a struct here, never the guest's
//! bytes, so the engine reads exactly what the guard judged. Fields an SDK sends that the
//! guard does not relay (observe descriptors, the asserted `caller`) are read and dropped:
//! the guard strips the engine's `features`, so an SDK behind it never turns them on.
//!
//! The engine's messages are trusted but also rebuilt, so nothing reaches a guest but the
//! fields named here (never another worker's id).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::json;

/// Why a guest's frame is not a message the guard takes: the message type (or `frame`), the
/// rule, and for a message of the wrong shape serde's words (which name a field, never a
/// value), for the log; never the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed {
    pub kind: &'static str,
    pub rule: &'static str,
    pub detail: Option<String>,
}

impl Malformed {
    pub fn new(kind: &'static str, rule: &'static str) -> Malformed {
        Malformed {
            kind,
            rule,
            detail: None,
        }
    }
}

/// Everything a guest may send, decoded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Guest {
    RegisterFunction(RegisterFunction),
    UnregisterFunction(Unregister),
    InvokeFunction(InvokeFunction),
    InvocationResult(InvocationResult),
    Ping,
    Pong,
    Reattach(Reattach),
    RegisterTriggerType(RegisterTriggerType),
    UnregisterTriggerType(UnregisterTriggerType),
    RegisterTrigger(RegisterTrigger),
    UnregisterTrigger(UnregisterTrigger),
    TriggerRegistrationResult(TriggerRegistrationResult),
    /// A type the protocol does not name (observers, newer messages): ignored, as the
    /// protocol says unknown types are.
    Other,
}

/// The message types as the protocol spells them, for logs.
pub(crate) const REGISTER_FUNCTION: &str = "registerfunction";
pub(crate) const UNREGISTER_FUNCTION: &str = "unregisterfunction";
pub(crate) const INVOKE_FUNCTION: &str = "invokefunction";
pub(crate) const INVOCATION_RESULT: &str = "invocationresult";
pub(crate) const REATTACH: &str = "reattach";
pub(crate) const REGISTER_TRIGGER_TYPE: &str = "registertriggertype";
pub(crate) const UNREGISTER_TRIGGER_TYPE: &str = "unregistertriggertype";
pub(crate) const REGISTER_TRIGGER: &str = "registertrigger";
pub(crate) const UNREGISTER_TRIGGER: &str = "unregistertrigger";
pub(crate) const TRIGGER_REGISTRATION_RESULT: &str = "triggerregistrationresult";

/// Decodes one guest frame.
pub(crate) fn parse_guest(frame: &[u8]) -> Result<Guest, Malformed> {
    let value = json::parse(frame).map_err(|_| Malformed::new("frame", "not strict JSON"))?;
    let Value::Object(mut object) = value else {
        return Err(Malformed::new("frame", "not a JSON object"));
    };
    let Some(Value::String(kind)) = object.remove("type") else {
        return Err(Malformed::new("frame", "no string `type`"));
    };
    let rest = Value::Object(object);
    fn typed<T: serde::de::DeserializeOwned>(
        kind: &'static str,
        rest: Value,
    ) -> Result<T, Malformed> {
        serde_json::from_value(rest).map_err(|e| Malformed {
            kind,
            rule: "fields the SDKs send, of their types",
            detail: Some(shape_detail(&e)),
        })
    }
    Ok(match kind.as_str() {
        REGISTER_FUNCTION => Guest::RegisterFunction(typed(REGISTER_FUNCTION, rest)?),
        UNREGISTER_FUNCTION => Guest::UnregisterFunction(typed(UNREGISTER_FUNCTION, rest)?),
        INVOKE_FUNCTION => Guest::InvokeFunction(typed(INVOKE_FUNCTION, rest)?),
        INVOCATION_RESULT => Guest::InvocationResult(typed(INVOCATION_RESULT, rest)?),
        "ping" => {
            typed::<Empty>("ping", rest)?;
            Guest::Ping
        }
        "pong" => {
            typed::<Empty>("pong", rest)?;
            Guest::Pong
        }
        REATTACH => Guest::Reattach(typed(REATTACH, rest)?),
        REGISTER_TRIGGER_TYPE => Guest::RegisterTriggerType(typed(REGISTER_TRIGGER_TYPE, rest)?),
        UNREGISTER_TRIGGER_TYPE => {
            Guest::UnregisterTriggerType(typed(UNREGISTER_TRIGGER_TYPE, rest)?)
        }
        REGISTER_TRIGGER => Guest::RegisterTrigger(typed(REGISTER_TRIGGER, rest)?),
        UNREGISTER_TRIGGER => Guest::UnregisterTrigger(typed(UNREGISTER_TRIGGER, rest)?),
        TRIGGER_REGISTRATION_RESULT => {
            Guest::TriggerRegistrationResult(typed(TRIGGER_REGISTRATION_RESULT, rest)?)
        }
        _ => Guest::Other,
    })
}

/// serde's error, bounded: which field or type was wrong.
fn shape_detail(error: &serde_json::Error) -> String {
    error.to_string().chars().take(160).collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

/// A JSON value kept when present, `null` included (an absent field is `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// `registerfunction`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegisterFunction {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// An HTTP-invoked function: the engine calls `url` from the host. Refused from
    /// sandboxes, and from worker VMs unless the operator allows it (never with `auth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation: Option<HttpInvocation>,
    /// Observe hooks (0.25): read, never relayed.
    #[serde(default, skip_serializing)]
    pub observe: Option<ObserveDescriptor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ObserveDescriptor {
    #[serde(default)]
    pub delivery: Option<String>,
    #[serde(default)]
    pub args_format: Option<Value>,
    #[serde(default)]
    pub legacy_trigger_type: Option<String>,
    #[serde(default)]
    pub allow: Option<bool>,
}

/// `registerfunction.invocation` (iii-helpers' `HttpInvocationConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpInvocation {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<HttpMethod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// Names an environment variable of the engine's whose value the engine sends: always
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub(crate) enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

/// `unregisterfunction`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Unregister {
    pub id: String,
}

/// `invokefunction` from a guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InvokeFunction {
    /// Absent or `null`: fire-and-forget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<Uuid>,
    pub function_id: String,
    /// Absent reads as `null`, as the engine reads it.
    #[serde(default)]
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The handler a call was made from, asserted by the SDK (0.25, towards engines that
    /// advertise observe): read, never relayed.
    #[serde(default, skip_serializing)]
    pub caller: Option<Caller>,
    #[serde(default, skip_serializing)]
    pub observe_depth: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum Action {
    Void,
    Enqueue { queue: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Caller {
    #[serde(default)]
    pub worker_id: Option<String>,
    #[serde(default)]
    pub worker_name: Option<String>,
    #[serde(default)]
    pub function_id: Option<String>,
    #[serde(default)]
    pub invocation_id: Option<String>,
    #[serde(default)]
    pub parent: Option<ParentCaller>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ParentCaller {
    #[serde(default)]
    pub worker_id: Option<String>,
    #[serde(default)]
    pub worker_name: Option<String>,
    #[serde(default)]
    pub function_id: Option<String>,
    #[serde(default)]
    pub invocation_id: Option<String>,
}

/// `invocationresult` from a guest (the answer to a call the engine made to it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InvocationResult {
    pub invocation_id: Uuid,
    pub function_id: String,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacktrace: Option<String>,
}

/// `reattach`: the first message of a reconnect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Reattach {
    pub previous_worker_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reattach_token: Option<String>,
}

/// `registertriggertype` (worker mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegisterTriggerType {
    pub id: String,
    #[serde(default)]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_request_format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_request_format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `unregistertriggertype` (worker mode). The Node SDK sends the whole registration back;
/// only `id` and `namespace` mean anything to the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnregisterTriggerType {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing)]
    pub description: Option<String>,
    #[serde(default, skip_serializing)]
    pub trigger_request_format: Option<Value>,
    #[serde(default, skip_serializing)]
    pub call_request_format: Option<Value>,
}

/// `registertrigger`: from a worker binding a trigger to its function, and from the engine
/// to the worker that provides the trigger type (worker mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegisterTrigger {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    #[serde(default)]
    pub config: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_namespace: Option<String>,
    /// The Node SDK's own tag, sent beside `type`: read, not relayed.
    #[serde(default, skip_serializing)]
    pub message_type: Option<String>,
}

/// `unregistertrigger` (worker mode). The Python SDK may leave `trigger_type` out: the guard
/// fills it in from the trigger's registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnregisterTrigger {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_type: Option<String>,
    #[serde(default, skip_serializing)]
    pub message_type: Option<String>,
}

/// `triggerregistrationresult` (worker mode), both ways: a provider's answer to the
/// engine's `registertrigger`, and the engine's to a worker's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TriggerRegistrationResult {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// The Python SDK's, which the engine does not read: not relayed.
    #[serde(default, skip_serializing)]
    pub result: Option<Value>,
    #[serde(default, skip_serializing)]
    pub message_type: Option<String>,
}

/// The data of `engine::workers::register`, as the SDKs send it (Rust's `WorkerMetadata`
/// plus `features`; Python's and Node's dicts, whose absent values may come as `null`).
/// Never `_caller_worker_id`: the engine stamps that itself into object data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Announcement {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Telemetry>,
    /// Only the features whose messages the guard relays survive validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Telemetry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// Python's and Node's: a key for the SDK's own analytics, never the engine's business.
    #[serde(default, skip_serializing)]
    pub amplitude_api_key: Option<String>,
}

/// The data of `engine::channels::create`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChannelRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_size: Option<u32>,
}

/// What the guard sends the engine: one of the guest's messages, re-written.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(crate) enum ToEngine {
    RegisterFunction(RegisterFunction),
    UnregisterFunction(Unregister),
    InvokeFunction(InvokeFunction),
    InvocationResult(InvocationResult),
    Pong,
    Reattach(Reattach),
    RegisterTriggerType(RegisterTriggerType),
    UnregisterTriggerType(UnregisterTriggerType),
    RegisterTrigger(RegisterTrigger),
    UnregisterTrigger(UnregisterTrigger),
    TriggerRegistrationResult(TriggerRegistrationResult),
}

impl ToEngine {
    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("the guard's own messages serialise")
    }
}

// ----- engine to guest: read leniently (the engine is trusted and may add fields), rebuilt.

/// Everything the guard passes from the engine to a guest, rebuilt from its fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(crate) enum FromEngine {
    WorkerRegistered(WorkerRegistered),
    InvokeFunction(EngineCall),
    InvocationResult(EngineResult),
    RegistrationRejected(Rejected),
    RegisterTrigger(EngineTrigger),
    UnregisterTrigger(EngineUntrigger),
    TriggerRegistrationResult(EngineTriggerResult),
    Ping,
    #[serde(other, skip_serializing)]
    Other,
}

impl FromEngine {
    pub fn parse(frame: &[u8]) -> Option<FromEngine> {
        serde_json::from_slice(frame).ok()
    }

    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("the guard's own messages serialise")
    }
}

/// The greeting, without `features`: the guard relays the base protocol only, so the guest's
/// SDK does not turn on observers or local dispatch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct WorkerRegistered {
    pub worker_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reattach_token: Option<String>,
}

/// A call to one of the guest's functions. Not relayed: the caller's identity (`caller`,
/// `_caller_worker_id` in object data), the namespace, the routing action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EngineCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<Uuid>,
    pub function_id: String,
    #[serde(default)]
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// The result of one of the guest's calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EngineResult {
    pub invocation_id: Uuid,
    pub function_id: String,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
}

/// `registrationrejected`. `owner_worker_id` is always the guard's text when it reaches a
/// guest: the engine names the worker holding the id, which is what a guest must not learn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Rejected {
    pub code: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_id: Option<String>,
    #[serde(default)]
    pub owner_worker_id: String,
}

fn default_namespace() -> String {
    "default".into()
}

/// The engine asking the provider of a trigger type to bind a trigger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EngineTrigger {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    #[serde(default)]
    pub config: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EngineUntrigger {
    pub id: String,
    pub trigger_type: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EngineTriggerResult {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_messages_decode_and_unknown_fields_do_not() {
        let register = br#"{"type":"registerfunction","id":"g::f","description":"d","request_format":{"type":"object"},"metadata":{}}"#;
        assert!(matches!(
            parse_guest(register),
            Ok(Guest::RegisterFunction(_))
        ));
        let extra = br#"{"type":"registerfunction","id":"g::f","sneaky":1}"#;
        assert_eq!(parse_guest(extra).unwrap_err().kind, REGISTER_FUNCTION);
        let call = br#"{"type":"invokefunction","invocation_id":"0F0E0D0C-0B0A-4908-8706-050403020100","function_id":"m::add","data":{"a":1},"action":{"type":"void"},"namespace":"default"}"#;
        let Ok(Guest::InvokeFunction(call)) = parse_guest(call) else {
            panic!()
        };
        assert_eq!(
            call.invocation_id.unwrap().to_string(),
            "0f0e0d0c-0b0a-4908-8706-050403020100"
        );
        let not_uuid = br#"{"type":"invokefunction","invocation_id":"c-1","function_id":"x"}"#;
        assert!(parse_guest(not_uuid).is_err());
        let twice = br#"{"type":"invokefunction","function_id":"a","function_id":"b"}"#;
        assert!(parse_guest(twice).is_err());
        let two_types = br#"{"type":"ping","type":"registerfunction","id":"x"}"#;
        assert!(parse_guest(two_types).is_err());
        assert_eq!(parse_guest(br#"{"type":"observe"}"#), Ok(Guest::Other));
        assert!(parse_guest(br#"{"type":"ping","x":1}"#).is_err());
    }

    #[test]
    fn the_guards_text_is_what_it_decoded() {
        let call = InvokeFunction {
            invocation_id: Some(Uuid::nil()),
            function_id: "m::add".into(),
            data: serde_json::json!({"a": [1, 2]}),
            traceparent: None,
            baggage: None,
            action: Some(Action::Enqueue { queue: "q".into() }),
            metadata: None,
            namespace: None,
            caller: None,
            observe_depth: None,
        };
        let text = ToEngine::InvokeFunction(call.clone()).text();
        assert_eq!(
            parse_guest(text.as_bytes()),
            Ok(Guest::InvokeFunction(call))
        );
    }

    #[test]
    fn the_engines_messages_are_rebuilt_without_what_a_guest_must_not_see() {
        let greeting = FromEngine::parse(
            br#"{"type":"workerregistered","worker_id":"w","reattach_token":"t","features":["observe.v1"]}"#,
        )
        .unwrap();
        let text = greeting.text();
        assert!(!text.contains("features"), "{text}");
        assert!(text.contains(r#""worker_id":"w""#), "{text}");
        let call = FromEngine::parse(
            br#"{"type":"invokefunction","invocation_id":"00000000-0000-0000-0000-000000000000","function_id":"g::f","data":{"x":1},"caller":{"worker_id":"secret"},"namespace":"default"}"#,
        )
        .unwrap();
        let text = call.text();
        assert!(
            !text.contains("secret") && !text.contains("namespace"),
            "{text}"
        );
        assert_eq!(
            FromEngine::parse(br#"{"type":"newthing"}"#),
            Some(FromEngine::Other)
        );
    }
}
