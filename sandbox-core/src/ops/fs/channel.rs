//! Engine channels for file content (SPEC.md: `fs::read` answers `content` as a channel ref,
//! `fs::write` takes one): creating a channel through the shell's engine connection, and the
//! refs' JSON shape. Bytes flow with `iii-sdk`'s own channel reader and writer, so the framing
//! is the engine's, not ours.

use std::time::Duration;

use iii_sdk::channel::{ChannelReader, ChannelWriter, StreamChannelRef};
use plugin_api::Host;
use serde_json::{json, Value};

use crate::error::{FsCode, SandboxError};

/// How long creating a channel may take on the bus.
const CREATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one chunk may wait for the other end (a caller that never reads or never writes
/// gives up the stream after this, instead of holding the sandbox call forever).
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A channel made for one call: we keep one end, the caller gets the other's ref.
pub struct Channel {
    pub ours: StreamChannelRef,
    pub theirs: StreamChannelRef,
    engine_url: String,
}

impl Channel {
    /// `engine::channels::create` through the shell.
    pub async fn create(host: &Host) -> Result<Channel, SandboxError> {
        let engine_url = host.engine_url().ok_or_else(no_engine)?;
        let reply = host
            .invoke("engine::channels::create", &json!({}), CREATE_TIMEOUT)
            .await
            .map_err(|e| aborted(format!("cannot create a channel: {e}")))?;
        let end = |name: &str| -> Result<StreamChannelRef, SandboxError> {
            reply
                .get(name)
                .cloned()
                .and_then(|v| serde_json::from_value(v).ok())
                .ok_or_else(|| {
                    aborted(format!(
                        "engine::channels::create answered without a `{name}` ref: {reply}"
                    ))
                })
        };
        Ok(Channel {
            ours: end("writer")?,
            theirs: end("reader")?,
            engine_url,
        })
    }

    pub fn writer(&self) -> ChannelWriter {
        ChannelWriter::new(&self.engine_url, &self.ours)
    }

    /// The ref handed to the caller, as JSON.
    pub fn their_ref(&self) -> Value {
        serde_json::to_value(&self.theirs).unwrap_or(Value::Null)
    }
}

/// The reader end a caller gave in `fs::write`'s `content`.
pub fn reader_from(host: &Host, content: &Value) -> Result<ChannelReader, SandboxError> {
    let channel_ref: StreamChannelRef = serde_json::from_value(content.clone()).map_err(|e| {
        SandboxError::InvalidRequest(format!(
            "`content` must be a UTF-8 string or a channel ref \
             {{channel_id, access_key, direction}}: {e}"
        ))
    })?;
    let direction = serde_json::to_value(&channel_ref.direction).unwrap_or(Value::Null);
    if direction != "read" {
        return Err(SandboxError::InvalidRequest(format!(
            "`content` must be the channel's read end (direction \"read\"), got {direction}"
        )));
    }
    let engine_url = host.engine_url().ok_or_else(no_engine)?;
    Ok(ChannelReader::new(&engine_url, &channel_ref))
}

/// S218: the stream broke (retryable: a new channel may work).
pub fn aborted(message: String) -> SandboxError {
    SandboxError::Fs {
        code: FsCode::StreamAborted,
        message,
        fix: None,
    }
}

fn no_engine() -> SandboxError {
    SandboxError::Unsupported(
        "channels need the engine connection of the shell, and this plugin runs without one".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_read_end_is_accepted() {
        let host = Host::none();
        let write_end = json!({"channel_id": "c", "access_key": "k", "direction": "write"});
        for bad in [json!({"channel_id": "c"}), json!({"x": 1}), write_end] {
            let error = reader_from(&host, &bad).err().expect("refused");
            assert_eq!(error.code(), "S001", "{bad}");
        }
        let read_end = json!({"channel_id": "c", "access_key": "k", "direction": "read"});
        // Well formed, but no engine to reach without a shell.
        let error = reader_from(&host, &read_end).err().expect("no engine");
        assert_eq!(error.code(), "S219");
    }
}
