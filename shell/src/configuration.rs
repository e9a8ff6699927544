//! Reading the adapter's configuration entry from the engine, once, at start-up.

use std::time::Duration;

use iii_sdk::protocol::TriggerRequest;
use iii_sdk::{Error as SdkError, IIIClient};
use serde_json::{json, Value};

const READ_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum ConfigReadError {
    #[error(
        "configuration entry `{id}` does not exist on the engine: create it with \
         `configuration::register {{\"id\":\"{id}\",\"name\":\"{id}\",\"description\":\"sandbox adapter\",\"schema\":{{}}}}` \
         then `configuration::set {{\"id\":\"{id}\",\"value\":{{}}}}` (iii Compose does this for you), and start the adapter again"
    )]
    NotFound { id: String },
    #[error("cannot read configuration entry `{id}`: {reason}")]
    Failed { id: String, reason: String },
    #[error("configuration entry `{id}` came back without a `value`")]
    NoValue { id: String },
    /// The engine refused this worker while the read was in flight: the SDK fails pending
    /// calls with the refusal before `fatal_error()` reports it, so it must be told apart here.
    #[error("{0}")]
    Refused(SdkError),
}

/// `configuration::get {id}` -> the entry's value.
pub async fn read(iii: &IIIClient, id: &str) -> Result<Value, ConfigReadError> {
    let request = TriggerRequest {
        function_id: "configuration::get".into(),
        payload: json!({ "id": id }),
        action: None,
        timeout_ms: Some(READ_TIMEOUT.as_millis() as u64),
    };
    match iii.trigger(request).await {
        Ok(mut reply) => reply
            .get_mut("value")
            .map(Value::take)
            .ok_or_else(|| ConfigReadError::NoValue { id: id.into() }),
        Err(SdkError::Remote { code, .. }) if code == "NOT_FOUND" => {
            Err(ConfigReadError::NotFound { id: id.into() })
        }
        Err(refusal @ SdkError::RegistrationRejected { .. }) => {
            Err(ConfigReadError::Refused(refusal))
        }
        Err(SdkError::Remote { code, message, .. }) => Err(ConfigReadError::Failed {
            id: id.into(),
            reason: format!("{code}: {message}"),
        }),
        Err(other) => Err(ConfigReadError::Failed {
            id: id.into(),
            reason: other.to_string(),
        }),
    }
}
