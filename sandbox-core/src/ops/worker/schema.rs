//! JSON Schemas of the `worker::*` functions (SPEC.md section 6), registered by the shell.

use serde_json::{json, Value};

use crate::functions::object;

/// (id suffix, description, request schema, response schema) of each worker function.
pub fn specs() -> Vec<(&'static str, &'static str, Value, Value)> {
    vec![
        (
            "prepare",
            "Prepare a worker VM: image installed, host directory checked, state directory ready (idempotent)",
            request(
                &["vm_id", "image", "host_path"],
                json!({
                    "image": {"type": "string", "description": "Catalog name, e.g. python or node"},
                    "host_path": {"type": "string", "description": "Absolute host directory under an allowed root (S501 otherwise); read-only at /worker"},
                    "cpus": {"type": "integer", "minimum": 1},
                    "memory_mb": {"type": "integer", "minimum": 16},
                }),
            ),
            object(
                &["vm_id", "state", "state_dir"],
                json!({"vm_id": vm_id(), "state": state(), "state_dir": {"type": "string"}}),
            ),
        ),
        (
            "start",
            "Boot a prepared worker VM and run its program (idempotent while it runs)",
            request(
                &["vm_id", "command"],
                json!({
                    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "argv of the program; needs /bin/sh in the image"},
                    "env": {
                        "description": "Environment: [\"K=V\", ...] or {\"K\": \"V\"}; the worker token is removed (by name and by value)",
                        "oneOf": [
                            {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
                            {"type": "object", "additionalProperties": {"type": "string"}}
                        ]
                    },
                    "workdir": {"type": "string", "default": "/worker"},
                }),
            ),
            status_response(),
        ),
        (
            "status",
            "State of a worker VM",
            request(&["vm_id"], json!({})),
            status_response(),
        ),
        (
            "logs",
            "Bounded tail of a worker VM's program output",
            request(
                &["vm_id"],
                json!({"max_bytes": {"type": "integer", "minimum": 1, "maximum": 1_048_576, "default": 65536}}),
            ),
            object(
                &["vm_id", "content", "truncated"],
                json!({"vm_id": vm_id(), "content": {"type": "string"}, "truncated": {"type": "boolean"}}),
            ),
        ),
        (
            "stop",
            "Stop a worker VM: SIGTERM to its program, killed after timeout_ms (idempotent)",
            request(
                &["vm_id"],
                json!({"timeout_ms": {"type": "integer", "minimum": 0, "default": 10000}}),
            ),
            object(&["vm_id", "state"], json!({"vm_id": vm_id(), "state": state()})),
        ),
        (
            "destroy",
            "Stop a worker VM if it runs and delete its state directory (idempotent)",
            request(&["vm_id"], json!({})),
            object(
                &["vm_id", "destroyed"],
                json!({"vm_id": vm_id(), "destroyed": {"type": "boolean", "description": "false when there was nothing to destroy"}}),
            ),
        ),
    ]
}

fn vm_id() -> Value {
    json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]{0,62}$"})
}

fn state() -> Value {
    json!({"enum": ["prepared", "running", "stopped", "exited", "failed"]})
}

/// A worker request: `auth` (checked and removed by the shell), `vm_id`, then `properties`.
fn request(required: &[&str], properties: Value) -> Value {
    let mut all = json!({
        "auth": {"type": "string", "description": "The worker token given to the adapter as III_SANDBOX_WORKER_TOKEN"},
        "vm_id": vm_id(),
    });
    if let (Some(all), Value::Object(extra)) = (all.as_object_mut(), properties) {
        all.extend(extra);
    }
    let required: Vec<&str> = std::iter::once("auth")
        .chain(required.iter().copied())
        .collect();
    object(&required, all)
}

fn status_response() -> Value {
    object(
        &["vm_id", "state", "image", "host_path"],
        json!({
            "vm_id": vm_id(),
            "state": state(),
            "pid": {"type": "integer", "description": "Host process holding the VM, while it runs"},
            "exit_code": {"type": "integer"},
            "started_at": {"type": "string", "format": "date-time"},
            "image": {"type": "string"},
            "host_path": {"type": "string"},
            "error": {"type": "string", "description": "Why the VM failed, when it did"},
            "vm_tuning": vm_tuning(),
        }),
    )
}

/// `status.vm_tuning`: the `III_VM_*` variables as read, what this backend gives a worker VM
/// of them, and why not the rest.
fn vm_tuning() -> Value {
    let values = json!({
        "hyperthreading": {"type": "boolean"},
        "nested_virt": {"type": "boolean"},
        "virtiofs_shm_size_mib": {"type": "integer", "minimum": 0},
        "nofile_limit": {"type": ["integer", "null"], "minimum": 1, "description": "null: left to the guest init"},
    });
    json!({
        "type": "object",
        "description": "The III_VM_* tuning of worker VMs (sandboxes never get it)",
        "required": ["backend", "requested", "applied", "not_applied"],
        "properties": {
            "backend": {"type": "string"},
            "requested": {"type": "object", "properties": values.clone()},
            "applied": {"type": "object", "properties": values},
            "not_applied": {"type": "object", "additionalProperties": {"type": "string"}, "description": "variable -> why this backend does not honour it"},
        },
    })
}
