//! What a plugin declares about itself: its adapter name and the functions it serves.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Version of the bus contract a plugin implements (SPEC.md: `contract`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractVersion {
    pub major: u32,
    pub minor: u32,
}

/// One function the plugin serves; the shell registers it as `<prefix>::<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionSpec {
    /// Id suffix, e.g. `exec` or `fs::read`.
    pub id: String,
    pub description: String,
    /// JSON Schema of the request object.
    pub request_schema: Value,
    /// JSON Schema of the response object.
    pub response_schema: Value,
    /// When true the shell checks the request's `auth` against the worker token (S505) and
    /// removes `auth` before the plugin sees the call.
    pub token_guarded: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Adapter name; also the default function id prefix.
    pub adapter: String,
    pub adapter_version: String,
    pub contract: ContractVersion,
    pub functions: Vec<FunctionSpec>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("the manifest has an empty adapter name")]
    EmptyAdapter,
    #[error("function id {0:?} is not valid (expected lower-case words joined by '::')")]
    BadFunctionId(String),
    #[error("function id {0:?} is declared twice")]
    DuplicateFunction(String),
}

impl Manifest {
    /// Checks what the shell relies on: a name, and unique, well-formed function ids.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.adapter.trim().is_empty() {
            return Err(ManifestError::EmptyAdapter);
        }
        let mut seen = std::collections::BTreeSet::new();
        for function in &self.functions {
            if !is_valid_function_id(&function.id) {
                return Err(ManifestError::BadFunctionId(function.id.clone()));
            }
            if !seen.insert(function.id.as_str()) {
                return Err(ManifestError::DuplicateFunction(function.id.clone()));
            }
        }
        Ok(())
    }

    pub fn function(&self, id: &str) -> Option<&FunctionSpec> {
        self.functions.iter().find(|f| f.id == id)
    }
}

fn is_valid_function_id(id: &str) -> bool {
    id.split("::").all(|word| {
        !word.is_empty()
            && word
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest(ids: &[&str]) -> Manifest {
        Manifest {
            adapter: "a".into(),
            adapter_version: "0".into(),
            contract: ContractVersion { major: 1, minor: 1 },
            functions: ids
                .iter()
                .map(|id| FunctionSpec {
                    id: id.to_string(),
                    description: String::new(),
                    request_schema: json!({}),
                    response_schema: json!({}),
                    token_guarded: false,
                })
                .collect(),
        }
    }

    #[test]
    fn accepts_nested_ids() {
        assert_eq!(
            manifest(&["exec", "fs::read", "adapter::info"]).validate(),
            Ok(())
        );
    }

    #[test]
    fn refuses_bad_and_duplicate_ids() {
        assert!(matches!(
            manifest(&["Exec"]).validate(),
            Err(ManifestError::BadFunctionId(_))
        ));
        assert!(matches!(
            manifest(&["fs::"]).validate(),
            Err(ManifestError::BadFunctionId(_))
        ));
        assert!(matches!(
            manifest(&["exec", "exec"]).validate(),
            Err(ManifestError::DuplicateFunction(_))
        ));
    }
}
