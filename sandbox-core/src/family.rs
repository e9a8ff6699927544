//! iii's sandbox family (ABI v0 of `iii-hq/workers`' `sandbox-CONTEXT.md`) over our own
//! operations. iii's `sandbox` router owns `sandbox::<leaf>` and forwards each call, its
//! `provider` field removed, to `sandbox::provider::<name>::<leaf>`; the shell registers those
//! ids from [`specs`] and calls the plugin with `family::<leaf>`, which lands in [`call`].
//!
//! Nothing here does the work of an operation: each ABI leaf is a request translated into one
//! of ours, that operation, and its reply translated back. Fields the ABI does not name pass
//! through to our operation unchanged (a family `create` may ask `network`, `env`, `cpus`; a
//! family `fs::write` may carry our `content`), and our other functions appear under the
//! family prefix as they are. Errors are ours, S-code and JSON body unchanged.

use std::sync::Arc;

use base64::Engine as _;
use plugin_api::FunctionSpec;
use serde_json::{json, Map, Value};

use crate::backend::Backend;
use crate::error::{FsCode, SandboxError};
use crate::functions::{object, uuid_schema};
use crate::plugin::SandboxPlugin;

/// Largest file the family's `fs::read` and `fs::write` carry inline as base64: past it a file
/// goes through an engine channel with our own `fs::read` / `fs::write` (a 16 MiB file is
/// about 21 MiB of base64, well inside the engine's 64 MiB message).
pub const INLINE_FILE_CAP: u64 = 16 * 1024 * 1024;

/// The ABI's optional capabilities, each with the family functions it needs. Whether one is
/// announced depends only on whether those functions are in the table the shell registers.
const CAPABILITIES: &[(&str, &[&str])] = &[
    ("fs", &["fs::read", "fs::write"]),
    ("snapshot", &["snapshot"]),
    ("branch", &["branch"]),
    ("expose_port", &["expose_port"]),
];

/// The ABI leaves whose shapes differ from ours: leaf, and the function of ours it stands on.
/// Every other function of ours appears under the family prefix with its own shapes.
const TRANSLATED: &[(&str, &str)] = &[
    ("create", "create"),
    ("exec", "exec"),
    ("stop", "stop"),
    ("list", "list"),
    ("snapshot", "snapshot::create"),
    ("branch", "fork"),
    ("fs::read", "fs::read"),
    ("fs::write", "fs::write"),
    ("expose_port", "port::expose"),
];

/// The family table from ours: the ABI leaves whose function of ours is served, then every
/// other function of ours that is not token-guarded (`worker::*` is iii Compose's interface
/// for worker VMs, not a sandbox's; the family surface carries no token).
pub fn specs(ours: &[FunctionSpec]) -> Vec<FunctionSpec> {
    let find = |id: &str| ours.iter().find(|f| f.id == id);
    let translated = TRANSLATED.iter().filter_map(|(leaf, our)| {
        let spec = find(our)?;
        let (description, request, response) = abi_shapes(leaf, spec);
        Some(FunctionSpec {
            id: (*leaf).to_string(),
            description,
            request_schema: request,
            response_schema: response,
            token_guarded: false,
        })
    });
    let passed = ours
        .iter()
        .filter(|f| !f.token_guarded && !TRANSLATED.iter().any(|(leaf, _)| *leaf == f.id))
        .cloned();
    translated.chain(passed).collect()
}

/// The capabilities `create` announces: those whose functions are all in `family`.
pub fn capabilities(family: &[FunctionSpec]) -> Vec<&'static str> {
    CAPABILITIES
        .iter()
        .filter(|(_, needs)| needs.iter().all(|id| family.iter().any(|f| f.id == *id)))
        .map(|(name, _)| *name)
        .collect()
}

/// Serves family function `leaf`.
pub async fn call<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    leaf: &str,
    payload: Value,
) -> Result<Value, SandboxError> {
    let ours = |id: &'static str, request: Value| Arc::clone(plugin).ours(id.to_string(), request);
    match leaf {
        "create" => {
            let asked = string_field(&payload, "image")?;
            let snapshot_image = snapshot_image(plugin, &asked, &payload);
            let request = create_request(payload, snapshot_image)?;
            let snapshot = request.get("snapshot").cloned();
            let reply = ours("create", request).await?;
            let started_at =
                chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            Ok(create_reply(
                reply,
                &asked,
                snapshot,
                started_at,
                &plugin.family_capabilities,
            ))
        }
        "exec" => ours("exec", exec_request(payload)?).await,
        "stop" => {
            let Some(request) = stop_request(payload)? else {
                return Ok(json!({}));
            };
            match ours("stop", request).await {
                Ok(_) => Ok(json!({})),
                Err(e) if stop_confirms_gone(&e) => Ok(json!({})),
                Err(e) => Err(e),
            }
        }
        "list" => Ok(list_reply(ours("list", payload).await?)),
        "snapshot" => Ok(snapshot_reply(
            ours("snapshot::create", snapshot_request(payload)?).await?,
        )),
        "branch" => ours("fork", branch_request(payload)?).await,
        "fs::read" => {
            let request = read_request(payload)?;
            let stat = ours("fs::stat", request.clone()).await?;
            check_read_size(plugin.adapter, &request, &stat)?;
            let reply = ours("fs::read", request).await?;
            let bytes = read_content(plugin, &reply).await?;
            Ok(read_reply(&reply, &bytes))
        }
        "fs::write" => ours("fs::write", write_request(payload)?).await,
        // Ours already takes `{sandbox_id, port}` and answers `{url}` (with `port` and
        // `host_port` beside it): only the name differs.
        "expose_port" => ours("port::expose", payload).await,
        other => Arc::clone(plugin).ours(other.to_string(), payload).await,
    }
}

/// The image of the snapshot `image` names, when it names one and no catalog image has that
/// name (a catalog image always wins, so a snapshot cannot shadow `python`), and the request
/// does not name a snapshot of its own (our `snapshot` field).
fn snapshot_image<B: Backend>(
    plugin: &SandboxPlugin<B>,
    image: &str,
    payload: &Value,
) -> Option<String> {
    if payload.get("snapshot").is_some() || !plugin.snapshots.exists(image) {
        return None;
    }
    if plugin
        .images
        .catalog()
        .iter()
        .any(|entry| entry.name == image)
    {
        return None;
    }
    plugin
        .snapshots
        .list()
        .into_iter()
        .find(|s| s.name == image)
        .map(|s| s.image)
}

fn string_field(payload: &Value, field: &str) -> Result<String, SandboxError> {
    payload
        .get(field)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| SandboxError::InvalidRequest(format!("missing string field `{field}`")))
}

fn fields(payload: Value) -> Result<Map<String, Value>, SandboxError> {
    match payload {
        Value::Object(map) => Ok(map),
        other => Err(SandboxError::InvalidRequest(format!(
            "the request must be a JSON object, got {other}"
        ))),
    }
}

/// `create {image}` where `image` is a snapshot's id: our create of the snapshot's image
/// `from` it.
fn create_request(payload: Value, snapshot_image: Option<String>) -> Result<Value, SandboxError> {
    let mut request = fields(payload)?;
    if let Some(image) = snapshot_image {
        let name = request.insert("image".into(), Value::String(image));
        request.insert("snapshot".into(), name.unwrap_or(Value::Null));
    }
    Ok(Value::Object(request))
}

/// Ours (`{sandbox_id, image}`) in the ABI's shape: `image` as the caller gave it (a
/// snapshot's id stays one), `snapshot` when the sandbox started from one, when it started,
/// what it can do.
fn create_reply(
    reply: Value,
    asked: &str,
    snapshot: Option<Value>,
    started_at: String,
    capabilities: &[&str],
) -> Value {
    let mut reply = reply;
    if let Some(snapshot) = snapshot {
        reply["snapshot"] = snapshot;
    }
    reply["image"] = Value::String(asked.to_string());
    reply["started_at"] = Value::String(started_at);
    reply["capabilities"] = json!(capabilities);
    reply
}

/// The ABI's `cwd` is our `workdir`; `cmd` + `args` and `env` are ours already (`cmd` alone
/// is split like a shell line, without expansion).
fn exec_request(payload: Value) -> Result<Value, SandboxError> {
    let mut request = fields(payload)?;
    if let Some(cwd) = request.remove("cwd") {
        if request.contains_key("workdir") {
            return Err(SandboxError::InvalidRequest(
                "give `cwd` or `workdir`, not both".into(),
            ));
        }
        request.insert("workdir".into(), cwd);
    }
    Ok(Value::Object(request))
}

/// Our `stop` request, or `None` when the id cannot name a sandbox (not a UUID): nothing by
/// that id runs, which is all a family `stop` has to confirm.
fn stop_request(payload: Value) -> Result<Option<Value>, SandboxError> {
    let id = string_field(&payload, "sandbox_id")?;
    if crate::request::sandbox_id(&id).is_err() {
        return Ok(None);
    }
    Ok(Some(payload))
}

/// A sandbox never known (S002) or stopped already (S004) is not running: the ABI's `stop`
/// succeeds on the observed post-state.
fn stop_confirms_gone(error: &SandboxError) -> bool {
    matches!(
        error,
        SandboxError::UnknownSandbox(_) | SandboxError::Stopped(_)
    )
}

/// `reconciled` is a boolean in the ABI (whether `in_flight` was checked against what runs);
/// ours counts the leftovers of an earlier run cleaned at start-up. Our counts come from the
/// adapter's own registry of what runs, so they are always reconciled; the count stays as
/// `reconciled_leftovers`.
fn list_reply(reply: Value) -> Value {
    let mut reply = reply;
    let leftovers = reply.get("reconciled").cloned().unwrap_or(json!(0));
    reply["reconciled_leftovers"] = leftovers;
    reply["reconciled"] = Value::Bool(true);
    reply
}

/// `snapshot {sandbox_id}`: our `snapshot::create` under a new name (or the caller's `name`),
/// which is the snapshot's id.
fn snapshot_request(payload: Value) -> Result<Value, SandboxError> {
    let mut request = fields(payload)?;
    if !request.contains_key("name") {
        let name = format!("snap-{}", uuid::Uuid::new_v4().simple());
        request.insert("name".into(), Value::String(name));
    }
    Ok(Value::Object(request))
}

fn snapshot_reply(reply: Value) -> Value {
    let mut reply = reply;
    reply["snapshot_id"] = reply.get("name").cloned().unwrap_or(Value::Null);
    reply
}

/// `branch {sandbox_id, count?}`: our `fork`, two when `count` is absent.
fn branch_request(payload: Value) -> Result<Value, SandboxError> {
    let mut request = fields(payload)?;
    request.entry("count").or_insert(json!(2));
    Ok(Value::Object(request))
}

fn read_request(payload: Value) -> Result<Value, SandboxError> {
    let sandbox_id = string_field(&payload, "sandbox_id")?;
    let path = string_field(&payload, "path")?;
    Ok(json!({"sandbox_id": sandbox_id, "path": path}))
}

/// Refuses, before anything is read, a file too large to travel inline.
fn check_read_size(adapter: &str, request: &Value, stat: &Value) -> Result<(), SandboxError> {
    let size = stat.get("size").and_then(Value::as_u64).unwrap_or(0);
    if size <= INLINE_FILE_CAP {
        return Ok(());
    }
    Err(too_large(
        format!("the file is {size} bytes, above the {INLINE_FILE_CAP} bytes `fs::read` answers inline as base64"),
        json!({"function": format!("{adapter}::fs::read"), "payload": request}),
        format!(
            "call our own fs::read (`{adapter}::fs::read`, or the prefix the adapter serves under) \
             with the same request: its `content` is the read end of an engine channel carrying \
             the whole file, whatever its size"
        ),
    ))
}

/// S210 with the channel form as `fix`. Not the family's S200 (resource oversize): our S200
/// is an exec's timeout, and one code must keep one meaning for our callers.
fn too_large(message: String, fix: Value, note: String) -> SandboxError {
    SandboxError::Fs {
        code: FsCode::BadRequest,
        message,
        fix: Some((fix, note)),
    }
}

/// The file's bytes from our `fs::read` reply: its content channel read to the end (which
/// also lets our stream finish at once), or `body` where no channel could be made.
async fn read_content<B: Backend>(
    plugin: &SandboxPlugin<B>,
    reply: &Value,
) -> Result<Vec<u8>, SandboxError> {
    use crate::ops::fs::channel::{aborted, reader_from, STALL_TIMEOUT};
    let content = reply.get("content").cloned().unwrap_or(Value::Null);
    if content.is_null() {
        let body = reply
            .get("body")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return Ok(body.as_bytes().to_vec());
    }
    let reader = reader_from(&plugin.host, &content)?;
    let mut bytes = Vec::new();
    loop {
        let next = tokio::time::timeout(STALL_TIMEOUT, reader.next_binary())
            .await
            .map_err(|_| aborted("the file's content channel stalled".into()))?
            .map_err(|e| aborted(format!("reading the file's content channel: {e}")))?;
        let Some(chunk) = next else { break };
        bytes.extend_from_slice(&chunk);
        // The file grew past the cap after its size was checked.
        if bytes.len() as u64 > INLINE_FILE_CAP {
            let _ = reader.close().await;
            return Err(too_large(
                format!("the file grew past the {INLINE_FILE_CAP} bytes `fs::read` answers inline while it was read"),
                Value::Null,
                format!("read it with our own fs::read (`{}::fs::read`): its `content` channel carries any size", plugin.adapter),
            ));
        }
    }
    let _ = reader.close().await;
    Ok(bytes)
}

/// `{bytes_base64}`, with our `size`, `mode` and `mtime` beside it.
fn read_reply(reply: &Value, bytes: &[u8]) -> Value {
    json!({
        "bytes_base64": base64::engine::general_purpose::STANDARD.encode(bytes),
        "size": bytes.len(),
        "mode": reply.get("mode"),
        "mtime": reply.get("mtime"),
    })
}

/// `fs::write {bytes_base64, mode?}`: our `content_b64`, and the mode as our octal string
/// (the ABI's is a number, `0o644` = 420). Without `bytes_base64` the request is ours as it
/// is (`content` as text or a channel's read end).
fn write_request(payload: Value) -> Result<Value, SandboxError> {
    let mut request = fields(payload)?;
    if let Some(mode) = request.get("mode").and_then(Value::as_u64) {
        if mode > 0o7777 {
            return Err(SandboxError::InvalidRequest(format!(
                "`mode` {mode} is not a file mode (at most 0o7777 = 4095)"
            )));
        }
        request.insert("mode".into(), Value::String(format!("{mode:04o}")));
    }
    let Some(data) = request.remove("bytes_base64") else {
        return Ok(Value::Object(request));
    };
    let Value::String(data) = data else {
        return Err(SandboxError::InvalidRequest(
            "`bytes_base64` must be a base64 string".into(),
        ));
    };
    if request.contains_key("content") || request.contains_key("content_b64") {
        return Err(SandboxError::InvalidRequest(
            "give one of `bytes_base64`, `content` and `content_b64`".into(),
        ));
    }
    // Four base64 characters carry three bytes.
    if (data.len() as u64) / 4 * 3 > INLINE_FILE_CAP {
        return Err(too_large(
            format!("`bytes_base64` holds more than the {INLINE_FILE_CAP} bytes `fs::write` takes inline"),
            json!({"content": {"channel_id": "<from engine::channels::create>", "access_key": "<its key>", "direction": "read"}}),
            "send the bytes through an engine channel (engine::channels::create; write them to \
             its writer and close it) and give its read end as `content` in place of \
             `bytes_base64`, to this function or to our own fs::write"
                .into(),
        ));
    }
    request.insert("content_b64".into(), Value::String(data));
    Ok(Value::Object(request))
}

/// Description, request and response schema of ABI leaf `leaf`, over `ours` (the function
/// of ours it stands on): requests keep our fields, since they pass through.
fn abi_shapes(leaf: &str, ours: &FunctionSpec) -> (String, Value, Value) {
    let count = json!({"type": "integer", "minimum": 0});
    let with = |schema: &Value, field: &str, property: Value| {
        let mut schema = schema.clone();
        schema["properties"][field] = property;
        schema
    };
    let string = json!({"type": "string"});
    match leaf {
        "create" => (
            "Boot a sandbox (ABI v0): `image` is a catalog image or a `snapshot` id".into(),
            with(
                &ours.request_schema,
                "image",
                json!({"type": "string", "description": "Catalog name (python, node, or a custom image), or a snapshot_id from `snapshot`"}),
            ),
            object(
                &["sandbox_id", "image", "started_at", "capabilities"],
                json!({
                    "sandbox_id": uuid_schema(),
                    "image": string,
                    "started_at": {"type": "string", "format": "date-time"},
                    "capabilities": {"type": "array", "items": {"type": "string"}},
                    "snapshot": {"type": "string", "description": "present when `image` named a snapshot"},
                }),
            ),
        ),
        "exec" => (
            "Run a program in a sandbox (ABI v0; `cwd` is the working directory)".into(),
            with(&ours.request_schema, "cwd", string.clone()),
            ours.response_schema.clone(),
        ),
        "stop" => (
            "Stop a sandbox (ABI v0): succeeds for any id nothing runs under".into(),
            object(
                &["sandbox_id"],
                json!({"sandbox_id": string, "wait": {"type": "boolean", "default": false}}),
            ),
            object(&[], json!({})),
        ),
        "list" => (
            "Live sandboxes and the adapter's slots (ABI v0)".into(),
            ours.request_schema.clone(),
            with(
                &with(&ours.response_schema, "reconciled", json!({"type": "boolean"})),
                "reconciled_leftovers",
                count.clone(),
            ),
        ),
        "snapshot" => (
            "Keep a running sandbox's files; `create {image: snapshot_id}` starts from them (ABI v0)".into(),
            object(
                &["sandbox_id"],
                json!({"sandbox_id": uuid_schema(), "name": ours.request_schema["properties"]["name"]}),
            ),
            with(&ours.response_schema, "snapshot_id", string.clone()),
        ),
        "branch" => (
            "Start `count` sandboxes (default 2) with a running sandbox's files (ABI v0; our `fork`)".into(),
            object(
                &["sandbox_id"],
                json!({"sandbox_id": uuid_schema(), "count": {"type": "integer", "minimum": 1, "default": 2}}),
            ),
            ours.response_schema.clone(),
        ),
        "fs::read" => (
            format!("Read a file from a sandbox as base64, up to {INLINE_FILE_CAP} bytes (ABI v0)"),
            object(
                &["sandbox_id", "path"],
                json!({"sandbox_id": uuid_schema(), "path": string}),
            ),
            object(
                &["bytes_base64"],
                json!({
                    "bytes_base64": {"type": "string", "contentEncoding": "base64"},
                    "size": count,
                    "mode": string,
                    "mtime": {"type": "integer"},
                }),
            ),
        ),
        "fs::write" => (
            format!("Write a file in a sandbox from base64, up to {INLINE_FILE_CAP} bytes (ABI v0)"),
            with(
                &with(
                    &ours.request_schema,
                    "bytes_base64",
                    json!({"type": "string", "contentEncoding": "base64"}),
                ),
                "mode",
                json!({"description": "a number (0o644 = 420) or our octal string (\"0644\")", "oneOf": [{"type": "integer", "minimum": 0, "maximum": 4095}, {"type": "string"}]}),
            ),
            ours.response_schema.clone(),
        ),
        "expose_port" => (
            "Reach a server listening in a sandbox on `port` from the host: `{url}` (ABI v0; our `port::expose`)".into(),
            ours.request_schema.clone(),
            ours.response_schema.clone(),
        ),
        _ => (
            ours.description.clone(),
            ours.request_schema.clone(),
            ours.response_schema.clone(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> Vec<FunctionSpec> {
        crate::functions::manifest("sandbox-libkrun", "0").functions
    }

    fn code(result: Result<Value, SandboxError>) -> &'static str {
        result.expect_err("refused").code()
    }

    #[test]
    fn the_table_has_the_abi_leaves_our_other_functions_and_no_worker_function() {
        let family = specs(&ours());
        let ids: Vec<&str> = family.iter().map(|f| f.id.as_str()).collect();
        for leaf in [
            "create",
            "exec",
            "stop",
            "list",
            "snapshot",
            "branch",
            "fs::read",
            "fs::write",
            "expose_port",
        ] {
            assert_eq!(ids.iter().filter(|id| **id == leaf).count(), 1, "{leaf}");
        }
        for ours in [
            "pause",
            "resume",
            "metrics",
            "fs::grep",
            "fs::watch",
            "snapshot::create",
            "fork",
            "run",
        ] {
            assert!(ids.contains(&ours), "{ours}");
        }
        assert!(ids.iter().all(|id| !id.starts_with("worker::")), "{ids:?}");
        assert!(family.iter().all(|f| !f.token_guarded));
        assert_eq!(
            family
                .iter()
                .find(|f| f.id == "create")
                .unwrap()
                .response_schema["required"],
            json!(["sandbox_id", "image", "started_at", "capabilities"])
        );
        assert_eq!(
            family
                .iter()
                .find(|f| f.id == "list")
                .unwrap()
                .response_schema["properties"]["reconciled"]["type"],
            "boolean"
        );
    }

    #[test]
    fn capabilities_follow_the_table() {
        let all = ours();
        assert_eq!(
            capabilities(&specs(&all)),
            vec!["fs", "snapshot", "branch", "expose_port"]
        );
        let without = |gone: &[&str]| -> Vec<FunctionSpec> {
            all.iter()
                .filter(|f| !gone.contains(&f.id.as_str()))
                .cloned()
                .collect()
        };
        assert_eq!(
            capabilities(&specs(&without(&["port::expose"]))),
            vec!["fs", "snapshot", "branch"]
        );
        assert_eq!(
            capabilities(&specs(&without(&["fs::write", "fork"]))),
            vec!["snapshot", "expose_port"]
        );
        assert_eq!(
            capabilities(&specs(&without(&["snapshot::create"]))),
            vec!["fs", "branch", "expose_port"]
        );
    }

    #[test]
    fn create_from_a_snapshot_asks_ours_with_the_snapshots_image() {
        let plain = create_request(json!({"image": "python", "network": true}), None).unwrap();
        assert_eq!(plain, json!({"image": "python", "network": true}));
        let from = create_request(
            json!({"image": "snap-1", "idle_timeout_secs": 60}),
            Some("python".into()),
        )
        .unwrap();
        assert_eq!(
            from,
            json!({"image": "python", "snapshot": "snap-1", "idle_timeout_secs": 60})
        );
        assert_eq!(code(create_request(json!(["python"]), None)), "S001");
        let reply = create_reply(
            json!({"sandbox_id": "u", "image": "python"}),
            "snap-1",
            Some(json!("snap-1")),
            "2026-01-02T03:04:05.678Z".into(),
            &["fs", "snapshot"],
        );
        assert_eq!(
            reply,
            json!({"sandbox_id": "u", "image": "snap-1", "snapshot": "snap-1",
                   "started_at": "2026-01-02T03:04:05.678Z", "capabilities": ["fs", "snapshot"]})
        );
        // Our own `snapshot` field, with the image named: the reply names the snapshot.
        let ours = create_reply(
            json!({"sandbox_id": "u", "image": "python"}),
            "python",
            Some(json!("mine")),
            "t".into(),
            &[],
        );
        assert_eq!(ours["image"], "python");
        assert_eq!(ours["snapshot"], "mine");
        let plain = create_reply(
            json!({"sandbox_id": "u", "image": "python"}),
            "python",
            None,
            "t".into(),
            &[],
        );
        assert!(plain.get("snapshot").is_none(), "{plain}");
    }

    #[test]
    fn exec_cwd_is_our_workdir() {
        let request = exec_request(json!({"sandbox_id": "u", "cmd": "ls", "args": ["-l"],
                                          "env": {"A": "1"}, "cwd": "/tmp", "timeout_ms": 5}))
        .unwrap();
        assert_eq!(
            request,
            json!({"sandbox_id": "u", "cmd": "ls", "args": ["-l"], "env": {"A": "1"},
                   "workdir": "/tmp", "timeout_ms": 5})
        );
        let unchanged = json!({"sandbox_id": "u", "argv": ["true"], "workdir": "/"});
        assert_eq!(exec_request(unchanged.clone()).unwrap(), unchanged);
        assert_eq!(
            code(exec_request(
                json!({"sandbox_id": "u", "cmd": "ls", "cwd": "/a", "workdir": "/b"})
            )),
            "S001"
        );
    }

    #[test]
    fn stop_succeeds_for_ids_nothing_runs_under() {
        assert_eq!(
            stop_request(json!({"sandbox_id": "not-a-uuid"})).unwrap(),
            None
        );
        let id = uuid::Uuid::new_v4().to_string();
        assert_eq!(
            stop_request(json!({"sandbox_id": id})).unwrap(),
            Some(json!({"sandbox_id": id}))
        );
        assert_eq!(code(stop_request(json!({})).map(|_| Value::Null)), "S001");
        assert!(stop_confirms_gone(&SandboxError::UnknownSandbox(
            "x".into()
        )));
        assert!(stop_confirms_gone(&SandboxError::Stopped("x".into())));
        assert!(!stop_confirms_gone(&SandboxError::Internal("x".into())));
    }

    #[test]
    fn list_reconciled_is_a_boolean_and_the_count_stays() {
        let reply = list_reply(
            json!({"sandboxes": [], "in_flight": 1, "cap": 4, "remaining": 3, "reconciled": 2}),
        );
        assert_eq!(reply["reconciled"], true);
        assert_eq!(reply["reconciled_leftovers"], 2);
        assert_eq!(reply["remaining"], 3);
    }

    #[test]
    fn snapshot_gets_a_name_and_answers_it_as_its_id() {
        let request = snapshot_request(json!({"sandbox_id": "u"})).unwrap();
        let name = request["name"].as_str().unwrap();
        assert!(name.starts_with("snap-"), "{name}");
        assert!(crate::snapshots::check_name(name).is_ok());
        assert_ne!(
            snapshot_request(json!({"sandbox_id": "u"})).unwrap()["name"],
            name
        );
        let named = snapshot_request(json!({"sandbox_id": "u", "name": "mine"})).unwrap();
        assert_eq!(named["name"], "mine");
        let reply = snapshot_reply(json!({"name": "mine", "image": "python"}));
        assert_eq!(reply["snapshot_id"], "mine");
    }

    #[test]
    fn branch_is_our_fork_of_two_by_default() {
        assert_eq!(
            branch_request(json!({"sandbox_id": "u"})).unwrap(),
            json!({"sandbox_id": "u", "count": 2})
        );
        assert_eq!(
            branch_request(json!({"sandbox_id": "u", "count": 3})).unwrap()["count"],
            3
        );
    }

    #[test]
    fn write_takes_base64_and_a_numeric_mode() {
        let request = write_request(json!({"sandbox_id": "u", "path": "/x",
                                          "bytes_base64": "AP8=", "mode": 0o755}))
        .unwrap();
        assert_eq!(
            request,
            json!({"sandbox_id": "u", "path": "/x", "content_b64": "AP8=", "mode": "0755"})
        );
        let ours = json!({"sandbox_id": "u", "path": "/x", "content": "hi", "mode": "0600", "parents": true});
        assert_eq!(write_request(ours.clone()).unwrap(), ours);
        for bad in [
            json!({"sandbox_id": "u", "path": "/x", "bytes_base64": "AA==", "mode": 0o10000}),
            json!({"sandbox_id": "u", "path": "/x", "bytes_base64": 5}),
            json!({"sandbox_id": "u", "path": "/x", "bytes_base64": "AA==", "content": "a"}),
        ] {
            assert_eq!(code(write_request(bad.clone())), "S001", "{bad}");
        }
    }

    #[test]
    fn files_past_the_cap_name_the_channel_form() {
        let big = "A".repeat((INLINE_FILE_CAP / 3 * 4 + 8) as usize);
        let error = write_request(json!({"sandbox_id": "u", "path": "/x", "bytes_base64": big}))
            .unwrap_err();
        let body = error.to_body();
        assert_eq!(body.code, "S210");
        assert_eq!(body.fix["content"]["direction"], "read");
        assert!(body.fix_note.unwrap().contains("engine::channels::create"));
        let just_fits = "A".repeat((INLINE_FILE_CAP / 3 * 4) as usize);
        assert!(
            write_request(json!({"sandbox_id": "u", "path": "/x", "bytes_base64": just_fits}))
                .is_ok()
        );

        let request = json!({"sandbox_id": "u", "path": "/big"});
        assert!(check_read_size(
            "sandbox-libkrun",
            &request,
            &json!({"size": INLINE_FILE_CAP})
        )
        .is_ok());
        let body = check_read_size(
            "sandbox-libkrun",
            &request,
            &json!({"size": INLINE_FILE_CAP + 1}),
        )
        .unwrap_err()
        .to_body();
        assert_eq!(body.code, "S210");
        assert_eq!(body.fix["function"], "sandbox-libkrun::fs::read");
        assert_eq!(body.fix["payload"], request);
    }

    #[test]
    fn read_answers_base64_of_the_bytes() {
        let reply = read_reply(
            &json!({"mode": "0640", "mtime": 7, "content": {}}),
            &[0, 255, 10],
        );
        assert_eq!(
            reply,
            json!({"bytes_base64": "AP8K", "size": 3, "mode": "0640", "mtime": 7})
        );
        assert_eq!(
            read_request(json!({"sandbox_id": "u", "path": "/p", "_caller_worker_id": "w"}))
                .unwrap(),
            json!({"sandbox_id": "u", "path": "/p"})
        );
    }
}
