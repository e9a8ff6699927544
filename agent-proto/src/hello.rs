//! The handshake: each side sends `Hello` first; a version mismatch ends the connection.

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change of frames or messages (the golden test pins them).
pub const PROTOCOL_VERSION: u32 = 1;

/// Sent by both sides as their first frame (request id 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    /// Free text naming the sender ("sandbox-agent 0.1.0"), for logs only.
    #[serde(default)]
    pub software: String,
    /// Optional abilities beyond this version's base protocol (e.g.
    /// [`crate::exec::FEATURE_EXEC_FLOW`]); a peer uses one only when the other lists it,
    /// so older peers (which send none and ignore the field) keep working.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

impl Hello {
    pub fn new(software: impl Into<String>) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            software: software.into(),
            features: Vec::new(),
        }
    }

    pub fn with_features(mut self, features: &[&str]) -> Hello {
        self.features = features.iter().map(|f| f.to_string()).collect();
        self
    }
}
