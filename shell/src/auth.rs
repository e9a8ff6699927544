//! The worker-token guard of `worker::*` functions (SPEC.md section 6).

use plugin_api::ErrorBody;
use serde_json::Value;
use subtle::ConstantTimeEq;

/// Environment variable carrying the per-project worker token.
pub const TOKEN_ENV: &str = "III_SANDBOX_WORKER_TOKEN";

/// The token the adapter was started with; never logged, never displayed.
#[derive(Clone)]
pub struct WorkerToken(Option<Vec<u8>>);

impl WorkerToken {
    pub fn from_env() -> Self {
        Self::new(std::env::var(TOKEN_ENV).ok())
    }

    pub fn new(token: Option<String>) -> Self {
        Self(token.filter(|t| !t.is_empty()).map(String::into_bytes))
    }

    /// Checks `payload.auth` in constant time and removes it, so the plugin (and anything it
    /// logs or hands to a guest) never holds the token.
    pub fn check_and_strip(&self, payload: &mut Value) -> Result<(), ErrorBody> {
        let offered = match payload.as_object_mut().and_then(|o| o.remove("auth")) {
            Some(Value::String(auth)) => auth,
            Some(_) => return Err(ErrorBody::unauthorized("`auth` must be a string")),
            None => {
                return Err(ErrorBody::unauthorized(
                    "missing `auth`: worker functions need the worker token",
                ))
            }
        };
        let Some(expected) = &self.0 else {
            return Err(ErrorBody::unauthorized(format!(
                "the adapter was started without {TOKEN_ENV}, so worker functions are refused"
            )));
        };
        if bool::from(offered.as_bytes().ct_eq(expected)) {
            Ok(())
        } else {
            Err(ErrorBody::unauthorized(
                "`auth` does not match the worker token",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn good_token_passes_and_is_removed() {
        let mut payload = json!({"auth": "s3cret", "vm_id": "a"});
        WorkerToken::new(Some("s3cret".into()))
            .check_and_strip(&mut payload)
            .unwrap();
        assert_eq!(payload, json!({"vm_id": "a"}));
    }

    #[test]
    fn wrong_missing_or_unconfigured_token_is_s505() {
        let token = WorkerToken::new(Some("s3cret".into()));
        for mut payload in [
            json!({"auth": "nope"}),
            json!({}),
            json!({"auth": 1}),
            json!("x"),
        ] {
            assert_eq!(
                token.check_and_strip(&mut payload).unwrap_err().code,
                "S505"
            );
        }
        let unconfigured = WorkerToken::new(None);
        let error = unconfigured
            .check_and_strip(&mut json!({"auth": ""}))
            .unwrap_err();
        assert_eq!(error.code, "S505");
        assert!(!error.message.contains("s3cret"));
    }
}
