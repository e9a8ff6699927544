//! The table of functions a sandbox plugin serves: id suffix, description, JSON Schemas, and
//! whether the worker token guards it. The shell registers exactly this table.

use plugin_api::{ContractVersion, FunctionSpec, Manifest};
use serde_json::{json, Value};

/// Contract version of SPEC.md this crate implements.
pub const CONTRACT: ContractVersion = ContractVersion { major: 1, minor: 1 };

/// The worker-VM operations of SPEC.md section 6; all guarded by the worker token.
pub const WORKER_OPERATIONS: &[&str] = &["prepare", "start", "status", "logs", "stop", "destroy"];

/// Builds the manifest of a plugin named `adapter`.
pub fn manifest(adapter: &str, adapter_version: &str) -> Manifest {
    let mut functions = vec![FunctionSpec {
        id: "adapter::info".into(),
        description: "Adapter name, version, contract version, features and host readiness".into(),
        request_schema: empty_request(),
        response_schema: info_response(),
        token_guarded: false,
    }];
    functions.extend(WORKER_OPERATIONS.iter().map(|op| FunctionSpec {
        id: format!("worker::{op}"),
        description: format!("Worker VM operation `{op}` (token-guarded; see SPEC.md section 6)"),
        request_schema: worker_request(),
        response_schema: json!({"type": "object"}),
        token_guarded: true,
    }));
    Manifest {
        adapter: adapter.to_string(),
        adapter_version: adapter_version.to_string(),
        contract: CONTRACT,
        functions,
    }
}

fn empty_request() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": true})
}

fn worker_request() -> Value {
    json!({
        "type": "object",
        "required": ["auth"],
        "properties": {
            "auth": {"type": "string", "description": "The worker token given to the adapter as III_SANDBOX_WORKER_TOKEN"}
        },
        "additionalProperties": true
    })
}

fn info_response() -> Value {
    json!({
        "type": "object",
        "required": ["adapter", "adapter_version", "contract", "features", "backend"],
        "properties": {
            "adapter": {"type": "string"},
            "adapter_version": {"type": "string"},
            "contract": {
                "type": "object",
                "required": ["major", "minor"],
                "properties": {"major": {"type": "integer"}, "minor": {"type": "integer"}}
            },
            "features": {"type": "array", "items": {"type": "string"}},
            "backend": {
                "type": "object",
                "required": ["name", "ready"],
                "properties": {
                    "name": {"type": "string"},
                    "ready": {"type": "boolean"},
                    "reason": {"type": ["string", "null"]}
                }
            }
        }
    })
}
