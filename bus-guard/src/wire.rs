//! The few fields of a worker-protocol message the guard judges by, read without building
//! the rest (`data` is never parsed, so a message is forwarded as the bytes it came as), and
//! the answers the guard sends in the engine's place.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::policy::Refusal;

/// The head of a message: its type and the ids that route it. A field named twice is an
/// error here (serde refuses duplicates of a declared field), so the guard and the engine
/// can never read two different ids out of one message.
#[derive(Debug, Deserialize)]
pub(crate) struct Head<'a> {
    #[serde(rename = "type", borrow)]
    pub kind: Cow<'a, str>,
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub function_id: Option<Cow<'a, str>>,
    /// A string, or absent / null for a fire-and-forget call.
    #[serde(default)]
    pub invocation_id: Option<Value>,
}

impl Head<'_> {
    /// The invocation id as a key (the text of a string id; `None` for a fire-and-forget
    /// call). A non-string id is malformed: `Err`.
    pub fn invocation_key(&self) -> Result<Option<String>, ()> {
        match &self.invocation_id {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(id)) => Ok(Some(normalize(id))),
            Some(_) => Err(()),
        }
    }
}

/// Invocation ids are UUIDs: the SDKs re-print them (the Rust SDK parses and formats), so
/// one id may come back in another case.
fn normalize(id: &str) -> String {
    uuid::Uuid::parse_str(id).map_or_else(|_| id.to_string(), |u| u.to_string())
}

/// `engine::workers::register`'s fields the guard checks.
#[derive(Debug, Deserialize)]
pub(crate) struct Announcement {
    #[serde(default)]
    pub data: AnnouncementData,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct AnnouncementData {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// The owner the SDKs log for a refused registration: not a worker, the guard's rule.
fn owner(refusal: &Refusal) -> String {
    refusal.to_string()
}

/// A refused function registration, as the engine refuses one another worker holds: the
/// SDKs skip that function and keep serving the others.
pub(crate) fn function_rejected(function_id: &str, refusal: &Refusal) -> String {
    json!({
        "type": "registrationrejected",
        "code": "FUNCTION_NAMESPACE_CONFLICT",
        "namespace": "default",
        "function_id": function_id,
        "owner_worker_id": owner(refusal),
    })
    .to_string()
}

/// A refused worker name: fatal for the SDKs, as the engine's own conflict is.
pub(crate) fn worker_rejected(name: &str, namespace: Option<&str>, refusal: &Refusal) -> String {
    json!({
        "type": "registrationrejected",
        "code": "WORKER_NAMESPACE_CONFLICT",
        "namespace": namespace.unwrap_or("default"),
        "worker_name": name,
        "owner_worker_id": owner(refusal),
    })
    .to_string()
}

/// The error code of a call the guard refused.
pub const REFUSED_CODE: &str = "bus_guard_refused";

/// The answer to a refused call, in the engine's place.
pub(crate) fn call_refused(invocation_id: &str, function_id: &str, refusal: &Refusal) -> String {
    json!({
        "type": "invocationresult",
        "invocation_id": invocation_id,
        "function_id": function_id,
        "error": { "code": REFUSED_CODE, "message": refusal.to_string() },
    })
    .to_string()
}

pub(crate) fn pong() -> String {
    json!({ "type": "pong" }).to_string()
}

/// `workerregistered` without its `features`: the guard relays the base protocol only, so
/// the guest's SDK does not turn on observers or local dispatch, whose messages the guard
/// does not carry.
pub(crate) fn without_features(frame: &[u8]) -> Option<String> {
    let mut message: Value = serde_json::from_slice(frame).ok()?;
    message.as_object_mut()?.remove("features");
    Some(message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_reads_the_routing_fields_only() {
        let head: Head = serde_json::from_str(
            r#"{"type":"invokefunction","invocation_id":"0F0E0D0C-0B0A-4908-8706-050403020100","function_id":"math::add","data":{"deep":[1,2,{"x":null}]}}"#,
        )
        .unwrap();
        assert_eq!(head.kind, "invokefunction");
        assert_eq!(head.function_id.as_deref(), Some("math::add"));
        assert_eq!(
            head.invocation_key(),
            Ok(Some("0f0e0d0c-0b0a-4908-8706-050403020100".into()))
        );
        let void: Head = serde_json::from_str(
            r#"{"type":"invokefunction","invocation_id":null,"function_id":"x"}"#,
        )
        .unwrap();
        assert_eq!(void.invocation_key(), Ok(None));
        let bad: Head = serde_json::from_str(
            r#"{"type":"invokefunction","invocation_id":7,"function_id":"x"}"#,
        )
        .unwrap();
        assert!(bad.invocation_key().is_err());
    }

    #[test]
    fn a_routing_field_named_twice_is_malformed() {
        let twice =
            r#"{"type":"invokefunction","function_id":"ok::fn","function_id":"sandbox::run"}"#;
        assert!(serde_json::from_str::<Head>(twice).is_err());
        let escaped: Head =
            serde_json::from_str(r#"{"type":"invokefunction","function_id":"\u0073andbox::run"}"#)
                .unwrap();
        assert_eq!(escaped.function_id.as_deref(), Some("sandbox::run"));
    }

    #[test]
    fn features_are_stripped_from_the_greeting() {
        let out = without_features(
            br#"{"type":"workerregistered","worker_id":"w","features":["observe.v1"]}"#,
        )
        .unwrap();
        assert!(!out.contains("features"), "{out}");
        assert!(out.contains(r#""worker_id":"w""#), "{out}");
    }
}
