//! The table of functions a sandbox plugin serves: id suffix, description, JSON Schemas, and
//! whether the worker token guards it. The shell registers exactly this table, and the family
//! table derived from it (`family::specs`) under `sandbox::provider::<name>::`.

use plugin_api::{ContractVersion, FunctionSpec, Manifest};
use serde_json::{json, Value};

/// Contract version of SPEC.md this crate implements.
pub const CONTRACT: ContractVersion = ContractVersion { major: 1, minor: 1 };

/// The worker-VM operations of SPEC.md section 6; all guarded by the worker token.
pub const WORKER_OPERATIONS: &[&str] = &["prepare", "start", "status", "logs", "stop", "destroy"];

/// Builds the manifest of a plugin named `adapter`.
pub fn manifest(adapter: &str, adapter_version: &str) -> Manifest {
    let function = |id: &str, description: &str, request: Value, response: Value| FunctionSpec {
        id: id.into(),
        description: description.into(),
        request_schema: request,
        response_schema: response,
        token_guarded: false,
    };
    let mut functions = vec![
        function(
            "create",
            "Boot a sandbox from a catalog image",
            create_request(),
            create_response(),
        ),
        function(
            "exec",
            "Run a program in a sandbox and return its output",
            exec_request(),
            exec_response(false),
        ),
        function(
            "exec::cancel",
            "End a running exec by its exec_id (from list's running_execs or a streamed exec's first line): its process group gets the signal (default SIGTERM, SIGKILL 2 s later), and the exec answers cancelled: true",
            object(
                &["sandbox_id", "exec_id"],
                json!({
                    "sandbox_id": uuid_schema(),
                    "exec_id": uuid_schema(),
                    "signal": crate::ops::cancel::signal_schema(),
                }),
            ),
            object(
                &["sandbox_id", "exec_id", "cancelled"],
                json!({"sandbox_id": uuid_schema(), "exec_id": uuid_schema(), "cancelled": {"type": "boolean"}}),
            ),
        ),
        function(
            "stop",
            "Stop a sandbox (idempotent)",
            stop_request(),
            stop_response(),
        ),
        function(
            "list",
            "List live sandboxes and the adapter's slots",
            empty_request(),
            list_response(),
        ),
        function(
            "metrics",
            "What a sandbox uses now (cpu, memory, disk, pids, network, uptime); null where the backend cannot tell",
            sandbox_request(),
            metrics_response(),
        ),
        function(
            "pause",
            "Freeze every process of a sandbox where it stands, keeping its memory (S310 where the backend cannot)",
            sandbox_request(),
            paused_response(),
        ),
        function(
            "resume",
            "Continue a paused sandbox (exec and fs calls on a paused sandbox resume it too)",
            sandbox_request(),
            paused_response(),
        ),
        function(
            "port::expose",
            "Reach a server listening in a sandbox on a port from the host: answers its URL (the same one while it stays exposed); closed when the sandbox stops or pauses",
            crate::ops::expose::port_request(),
            crate::ops::expose::expose_response(),
        ),
        function(
            "port::close",
            "Close a sandbox's exposed port (idempotent); its open connections end",
            crate::ops::expose::port_request(),
            crate::ops::expose::close_response(),
        ),
        function(
            "snapshot::create",
            "Keep a running sandbox's files (image plus writable layer) as a named template; the sandbox is frozen while they are copied",
            snapshot_create_request(),
            snapshot_response(),
        ),
        function(
            "snapshot::list",
            "The snapshots, and the disk they use against max_snapshot_disk_mb",
            empty_request(),
            snapshot_list_response(),
        ),
        function(
            "snapshot::delete",
            "Delete a snapshot; sandboxes started from it keep running",
            object(&["name"], json!({"name": snapshot_name_schema()})),
            object(
                &["deleted", "name"],
                json!({"deleted": {"type": "boolean"}, "name": {"type": "string"}}),
            ),
        ),
        function(
            "fork",
            "Start count new sandboxes with a running sandbox's files at this moment (all or nothing)",
            object(
                &["sandbox_id", "count"],
                json!({"sandbox_id": uuid_schema(), "count": {"type": "integer", "minimum": 1}}),
            ),
            object(
                &["sandbox_ids"],
                json!({"sandbox_ids": {"type": "array", "items": uuid_schema()}}),
            ),
        ),
        function(
            "catalog::list",
            "Images that sandboxes may boot",
            empty_request(),
            catalog_response(),
        ),
        function(
            "run",
            "Run code in a fresh sandbox that is gone when the call returns",
            run_request(),
            exec_response(true),
        ),
        function(
            "adapter::info",
            "Adapter name, version, contract, features and host readiness",
            empty_request(),
            info_response(),
        ),
    ];
    functions.extend(
        crate::ops::fs::schema::specs()
            .into_iter()
            .map(|(id, description, request, response)| {
                function(id, description, request, response)
            }),
    );
    functions.extend(
        crate::ops::process::schema::specs().into_iter().map(
            |(id, description, request, response)| function(id, description, request, response),
        ),
    );
    functions.extend(crate::ops::worker::schema::specs().into_iter().map(
        |(op, description, request, response)| FunctionSpec {
            id: format!("worker::{op}"),
            description: format!("{description} (token-guarded; SPEC.md section 6)"),
            request_schema: request,
            response_schema: response,
            token_guarded: true,
        },
    ));
    Manifest {
        adapter: adapter.to_string(),
        adapter_version: adapter_version.to_string(),
        contract: CONTRACT,
        family: crate::family::specs(&functions),
        functions,
    }
}

pub(crate) fn object(required: &[&str], properties: Value) -> Value {
    json!({"type": "object", "required": required, "properties": properties, "additionalProperties": true})
}

fn empty_request() -> Value {
    object(&[], json!({}))
}

fn env_schema() -> Value {
    json!({
        "description": "Environment: [\"K=V\", ...] or {\"K\": \"V\"}",
        "oneOf": [
            {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
            {"type": "object", "additionalProperties": {"type": "string"}}
        ]
    })
}

pub(crate) fn uuid_schema() -> Value {
    json!({"type": "string", "format": "uuid"})
}

fn create_request() -> Value {
    object(
        &["image"],
        json!({
            "image": {"type": "string", "description": "Catalog name, e.g. python or node"},
            "cpus": {"type": "integer", "minimum": 1},
            "memory_mb": {"type": "integer", "minimum": 16},
            "name": {"type": "string", "maxLength": 128},
            "network": {
                "description": "false: loopback only; true: egress under the configured policy; an object narrows that policy for this sandbox",
                "default": false,
                "oneOf": [
                    {"type": "boolean"},
                    {"type": "object", "additionalProperties": false, "properties": {
                        "allow": {"type": "array", "items": {"type": "string"}},
                        "deny": {"type": "array", "items": {"type": "string"}}
                    }}
                ]
            },
            "idle_timeout_secs": {"type": "integer", "minimum": 1, "maximum": crate::request::MAX_IDLE_TIMEOUT_SECS},
            "env": env_schema(),
            "snapshot": {
                "type": "string",
                "description": "Start from this snapshot's files (snapshot::create); `image` must be the snapshot's image"
            },
        }),
    )
}

fn snapshot_name_schema() -> Value {
    json!({"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"})
}

fn snapshot_create_request() -> Value {
    object(
        &["sandbox_id", "name"],
        json!({"sandbox_id": uuid_schema(), "name": snapshot_name_schema()}),
    )
}

fn snapshot_response() -> Value {
    object(
        &["name", "image", "size_bytes", "created_at"],
        json!({
            "name": {"type": "string"},
            "image": {"type": "string"},
            "size_bytes": {"type": "integer", "minimum": 0},
            "created_at": {"type": "string", "format": "date-time"},
        }),
    )
}

fn snapshot_list_response() -> Value {
    object(
        &["snapshots", "used_bytes", "budget_bytes"],
        json!({
            "snapshots": {"type": "array", "items": snapshot_response()},
            "used_bytes": {"type": "integer", "minimum": 0},
            "budget_bytes": {"type": "integer", "minimum": 0},
        }),
    )
}

fn create_response() -> Value {
    object(
        &["sandbox_id", "image"],
        json!({"sandbox_id": uuid_schema(), "image": {"type": "string"}}),
    )
}

fn exec_request() -> Value {
    object(
        &["sandbox_id"],
        json!({
            "sandbox_id": uuid_schema(),
            "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "cmd": {"type": "string", "description": "Program, or a whole command line split like a shell (no expansion) when `args` is absent"},
            "args": {"type": "array", "items": {"type": "string"}},
            "stdin": {"type": "string", "contentEncoding": "base64"},
            "env": env_schema(),
            "timeout_ms": {"type": "integer", "minimum": 1, "default": 300000},
            "workdir": {"type": "string"},
            "stream": crate::ops::stream::schema("write"),
            "stdin_stream": crate::ops::stream::schema("read"),
            "tty": crate::ops::stream::tty_schema(),
            "background": {"type": "boolean", "default": false, "description": "Start it as a background process and answer {process_id, pid} at once (see process::*); no stdin, stream or tty"},
        }),
    )
}

fn exec_response(with_sandbox_id: bool) -> Value {
    let mut properties = json!({
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "exit_code": {"type": "integer"},
        "timed_out": {"type": "boolean"},
        "duration_ms": {"type": "integer"},
        "success": {"type": "boolean"},
        "stdout_truncated": {"type": "boolean"},
        "stderr_truncated": {"type": "boolean"},
        "exec_id": {"type": "string", "format": "uuid", "description": "The exec's id (exec::cancel)"},
        "cancelled": {"type": "boolean", "description": "exec::cancel ended it"},
    });
    if with_sandbox_id {
        properties["sandbox_id"] = json!({"type": "string", "format": "uuid", "description": "Present when keep_sandbox was true"});
    }
    object(
        &[
            "stdout",
            "stderr",
            "exit_code",
            "timed_out",
            "duration_ms",
            "success",
            "stdout_truncated",
            "stderr_truncated",
        ],
        properties,
    )
}

fn stop_request() -> Value {
    object(
        &["sandbox_id"],
        json!({"sandbox_id": uuid_schema(), "wait": {"type": "boolean", "default": false}}),
    )
}

fn stop_response() -> Value {
    object(
        &["sandbox_id", "stopped"],
        json!({"sandbox_id": uuid_schema(), "stopped": {"type": "boolean"}}),
    )
}

fn list_response() -> Value {
    let count = json!({"type": "integer", "minimum": 0});
    object(
        &["sandboxes", "in_flight", "cap", "remaining", "reconciled"],
        json!({
            "sandboxes": {"type": "array", "items": object(
                &["sandbox_id", "image", "age_secs", "exec_in_progress", "exec_in_flight", "exec_slots_free", "stopped"],
                json!({
                    "sandbox_id": uuid_schema(),
                    "name": {"type": ["string", "null"]},
                    "image": {"type": "string"},
                    "age_secs": count,
                    "exec_in_progress": {"type": "boolean"},
                    "exec_in_flight": count,
                    "exec_slots_free": count,
                    "stopped": {"type": "boolean"},
                    "paused": {"type": "boolean", "description": "its processes are frozen (`pause`) until a `resume`, `exec` or `fs::*` call"},
                    "bus_functions": {"type": ["integer", "null"], "minimum": 0, "description": "functions the sandbox serves on the bus through the bus guard; null without a guard endpoint"},
                    "running_execs": {"type": "array", "items": object(&["exec_id", "argv0", "started_at"], json!({
                        "exec_id": uuid_schema(),
                        "argv0": {"type": "string"},
                        "started_at": {"type": "string", "format": "date-time"},
                    }))},
                }),
            )},
            "in_flight": count, "cap": count, "remaining": count, "reconciled": count,
            "pooled": {"type": "integer", "minimum": 0, "description": "slots held by warm-pool sandboxes (not listed; they yield to a create)"},
        }),
    )
}

fn sandbox_request() -> Value {
    object(&["sandbox_id"], json!({"sandbox_id": uuid_schema()}))
}

fn metrics_response() -> Value {
    let counter = |description: &str| json!({"type": ["integer", "null"], "minimum": 0, "description": description});
    object(
        &[
            "sandbox_id",
            "cpu_ms",
            "memory_bytes",
            "memory_peak_bytes",
            "disk_bytes",
            "pids",
            "net_rx_bytes",
            "net_tx_bytes",
            "uptime_ms",
        ],
        json!({
            "sandbox_id": uuid_schema(),
            "cpu_ms": counter("CPU time of the sandbox's processes"),
            "memory_bytes": counter("memory charged to the sandbox now (its layer's pages included on bwrap)"),
            "memory_peak_bytes": counter("the most memory charged to it at once"),
            "disk_bytes": counter("what its writable layer holds"),
            "pids": counter("processes and threads"),
            "net_rx_bytes": counter("received on its network interfaces, loopback aside"),
            "net_tx_bytes": counter("sent on its network interfaces, loopback aside"),
            "uptime_ms": {"type": "integer", "minimum": 0},
        }),
    )
}

fn paused_response() -> Value {
    object(
        &["sandbox_id", "paused"],
        json!({"sandbox_id": uuid_schema(), "paused": {"type": "boolean"}}),
    )
}

fn catalog_response() -> Value {
    object(
        &["images"],
        json!({
            "images": {"type": "array", "items": object(&["name", "oci_ref", "kind", "installed", "allowed"], json!({
                "name": {"type": "string"},
                "oci_ref": {"type": "string"},
                "kind": {"enum": ["preset", "custom"]},
                "installed": {"type": "boolean"},
                "allowed": {"type": "boolean"},
            }))}
        }),
    )
}

fn run_request() -> Value {
    object(
        &["image", "code", "lang"],
        json!({
            "image": {"type": "string"},
            "code": {"type": "string"},
            "lang": {"type": "string", "description": "python/py, node/js/javascript, sh/shell/bash, or an interpreter path"},
            "files": {"type": "array", "items": object(&["path", "content"], json!({"path": {"type": "string"}, "content": {"type": "string"}}))},
            "env": env_schema(),
            "stdin": {"type": "string", "contentEncoding": "base64"},
            "timeout_ms": {"type": "integer", "minimum": 1},
            "keep_sandbox": {"type": "boolean", "default": false},
            "stream": crate::ops::stream::schema("write"),
            "stdin_stream": crate::ops::stream::schema("read"),
            "tty": crate::ops::stream::tty_schema(),
        }),
    )
}

fn info_response() -> Value {
    object(
        &[
            "adapter",
            "adapter_version",
            "target",
            "contract",
            "features",
            "backend",
        ],
        json!({
            "adapter": {"type": "string"},
            "adapter_version": {"type": "string"},
            "target": {"type": "string"},
            "contract": object(&["major", "minor"], json!({"major": {"type": "integer"}, "minor": {"type": "integer"}})),
            "features": {"type": "array", "items": {"type": "string"}},
            "backend": object(&["name", "ready"], json!({
                "name": {"type": "string"},
                "ready": {"type": "boolean"},
                "reason": {"type": ["string", "null"]},
            })),
            "warm_pool": object(&["images"], json!({
                "images": {"type": "object", "additionalProperties": object(&["target", "ready", "booting"], json!({
                    "target": {"type": "integer", "minimum": 0},
                    "ready": {"type": "integer", "minimum": 0},
                    "booting": {"type": "integer", "minimum": 0},
                    "last_error": {"type": ["string", "null"]},
                }))},
                "handed_out": {"type": "integer", "minimum": 0},
                "evicted": {"type": "integer", "minimum": 0},
            })),
            "family": {
                "description": "iii's sandbox family surface (docs/family.md); null when it is off",
                "oneOf": [
                    {"type": "null"},
                    object(&["name", "prefix", "capabilities"], json!({
                        "name": {"type": "string"},
                        "prefix": {"type": "string"},
                        "capabilities": {"type": "array", "items": {"type": "string"}},
                    })),
                ],
            },
            "boots": object(&["on_create", "for_warm_pool"], json!({
                "on_create": {"type": "integer", "minimum": 0},
                "for_warm_pool": {"type": "integer", "minimum": 0},
            })),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_is_valid_and_guards_only_worker_functions() {
        let manifest = manifest("sandbox-libkrun", "0");
        manifest.validate().unwrap();
        for f in &manifest.functions {
            assert_eq!(f.token_guarded, f.id.starts_with("worker::"), "{}", f.id);
            assert_eq!(f.request_schema["type"], "object", "{}", f.id);
            assert_eq!(f.response_schema["type"], "object", "{}", f.id);
        }
        let workers: Vec<String> = WORKER_OPERATIONS
            .iter()
            .map(|op| format!("worker::{op}"))
            .collect();
        let guarded: Vec<String> = manifest
            .functions
            .iter()
            .filter(|f| f.token_guarded)
            .map(|f| f.id.clone())
            .collect();
        assert_eq!(guarded, workers);
        for f in manifest.functions.iter().filter(|f| f.token_guarded) {
            let required = f.request_schema["required"].as_array().unwrap();
            assert!(required.contains(&json!("auth")), "{}", f.id);
            assert!(required.contains(&json!("vm_id")), "{}", f.id);
        }
    }
}
