//! The answers the guard sends in the engine's place: refusals in the words the SDKs
//! understand, and `pong`.

use serde_json::json;

use crate::policy::Refusal;

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
