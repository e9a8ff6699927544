//! The error body every failure carries on the bus (SPEC.md section 4).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where every error's `docs_url` points.
pub const DOCS_URL: &str = "https://iii.dev/docs/creating-workers/sandboxes";

/// S-code of a `worker::*` request whose `auth` does not match the worker token.
pub const UNAUTHORIZED: &str = "S505";

/// S-code of a fault inside the adapter itself (a caught panic, a plugin that dropped a call).
/// Not in SPEC.md's table, which lists only the caller's failures; documented in the README.
pub const INTERNAL: &str = "S500";

/// `{type, code, message, docs_url, retryable, fix, fix_note}`; sent on the bus as the
/// invocation error's `message`, serialised as JSON, with `code` as the error code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: String,
    pub code: String,
    pub message: String,
    pub docs_url: String,
    pub retryable: bool,
    /// A machine-usable hint, e.g. `{"parents": true}`, or null.
    pub fix: Value,
    pub fix_note: Option<String>,
    /// What the call produced before it failed, when that matters to the caller (S200 carries
    /// the partial, bounded exec output here). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

impl ErrorBody {
    pub fn new(code: &str, kind: &str, message: impl Into<String>) -> Self {
        Self {
            kind: kind.to_string(),
            code: code.to_string(),
            message: message.into(),
            docs_url: DOCS_URL.to_string(),
            retryable: false,
            fix: Value::Null,
            fix_note: None,
            output: None,
        }
    }

    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    pub fn with_fix(mut self, fix: Value, note: impl Into<String>) -> Self {
        self.fix = fix;
        self.fix_note = Some(note.into());
        self
    }

    pub fn with_output(mut self, output: Value) -> Self {
        self.output = Some(output);
        self
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL, "internal_error", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(UNAUTHORIZED, "unauthorized", message)
    }

    pub fn to_json(&self) -> String {
        // Serialising a struct of strings, bools and a Value cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| format!("{{\"code\":\"{}\"}}", self.code))
    }

    /// Parses a body sent by a plugin; anything unreadable becomes an internal error that
    /// still carries the text, so nothing is lost.
    pub fn from_json(text: &str) -> Self {
        serde_json::from_str(text)
            .unwrap_or_else(|_| Self::internal(format!("plugin sent an unreadable error: {text}")))
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorBody {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_every_field_of_the_spec() {
        let body = ErrorBody::new("S001", "invalid_request", "missing field `image`")
            .with_fix(serde_json::json!({"parents": true}), "create parents");
        let value: Value = serde_json::from_str(&body.to_json()).unwrap();
        for key in [
            "type",
            "code",
            "message",
            "docs_url",
            "retryable",
            "fix",
            "fix_note",
        ] {
            assert!(value.get(key).is_some(), "missing {key} in {value}");
        }
        assert_eq!(value["type"], "invalid_request");
        assert_eq!(ErrorBody::from_json(&body.to_json()), body);
    }

    #[test]
    fn unreadable_body_keeps_its_text() {
        let body = ErrorBody::from_json("not json");
        assert_eq!(body.code, INTERNAL);
        assert!(body.message.contains("not json"));
    }
}
