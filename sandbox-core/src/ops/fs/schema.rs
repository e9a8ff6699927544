//! The JSON Schemas of the `fs::*` rows of the function table (SPEC.md section 2).

use agent_proto::fs::{
    GREP_DEFAULT_LINE_BYTES, GREP_DEFAULT_MATCHES, GREP_MAX_LINE_BYTES, GREP_MAX_MATCHES,
    SED_MAX_FILES,
};
use serde_json::{json, Value};

use crate::functions::{object, uuid_schema};

/// `(id suffix, description, request schema, response schema)` per fs function.
pub fn specs() -> Vec<(&'static str, &'static str, Value, Value)> {
    vec![
        (
            "fs::ls",
            "List a directory in a sandbox",
            path_request(&[], json!({})),
            object(
                &["entries"],
                json!({"entries": {"type": "array", "items": entry()}}),
            ),
        ),
        (
            "fs::stat",
            "Describe one path in a sandbox",
            path_request(&[], json!({})),
            entry(),
        ),
        (
            "fs::mkdir",
            "Create a directory in a sandbox",
            path_request(
                &[],
                json!({"mode": mode("0755"), "parents": flag("Create missing parents; an existing directory is then not an error")}),
            ),
            object(
                &["created"],
                json!({"created": {"type": "boolean", "description": "false when it existed already (parents: true)"}}),
            ),
        ),
        (
            "fs::write",
            "Write a file in a sandbox (replaces its contents)",
            write_request(),
            object(
                &["bytes_written", "path"],
                json!({"bytes_written": count(), "path": {"type": "string"}}),
            ),
        ),
        (
            "fs::read",
            "Read a file from a sandbox: UTF-8 files up to 1 MiB come back as `body`",
            path_request(&[], json!({})),
            read_response(),
        ),
        (
            "fs::rm",
            "Remove a file or directory in a sandbox",
            path_request(
                &[],
                json!({"recursive": flag("Remove a non-empty directory and everything under it")}),
            ),
            object(&["removed"], json!({"removed": {"type": "boolean"}})),
        ),
        (
            "fs::chmod",
            "Change the mode (and optionally owner) of a path in a sandbox",
            path_request(
                &["mode"],
                json!({
                    "mode": mode_pattern(),
                    "uid": {"type": "integer", "minimum": 0},
                    "gid": {"type": "integer", "minimum": 0},
                    "recursive": flag("Apply to everything under a directory (symlinks are skipped)"),
                }),
            ),
            object(
                &["updated"],
                json!({"updated": {"type": "integer", "minimum": 0, "description": "Paths changed"}}),
            ),
        ),
        (
            "fs::mv",
            "Move or rename a path in a sandbox",
            object(
                &["sandbox_id", "src", "dst"],
                json!({
                    "sandbox_id": uuid_schema(),
                    "src": guest_path(),
                    "dst": guest_path(),
                    "overwrite": flag("Replace an existing destination"),
                }),
            ),
            object(&["moved"], json!({"moved": {"type": "boolean"}})),
        ),
        (
            "fs::grep",
            "Search files in a sandbox for lines matching a regex (binary files and links are skipped)",
            grep_request(),
            object(
                &["matches", "truncated"],
                json!({
                    "matches": {"type": "array", "items": object(
                        &["path", "line", "content"],
                        json!({
                            "path": {"type": "string"},
                            "line": {"type": "integer", "minimum": 1},
                            "content": {"type": "string", "description": "The line without its newline, cut to max_line_bytes"},
                        }),
                    )},
                    "truncated": {"type": "boolean", "description": "More matches exist than were returned (max_matches or the 1 MiB reply bound)"},
                }),
            ),
        ),
        (
            "fs::sed",
            "Replace a pattern in files of a sandbox; each file is rewritten atomically, mode and owner kept",
            sed_request(),
            object(
                &["results", "total_replacements"],
                json!({
                    "results": {"type": "array", "items": object(
                        &["path", "replacements", "success"],
                        json!({
                            "path": {"type": "string"},
                            "replacements": count(),
                            "success": {"type": "boolean"},
                            "error": {"type": "string", "description": "Why this file failed (present when success is false)"},
                        }),
                    )},
                    "total_replacements": count(),
                }),
            ),
        ),
        (
            "fs::watch",
            "Watch a path in a sandbox: created, modified, deleted and moved paths streamed as NDJSON lines into a channel until it is closed or the sandbox stops",
            watch_request(),
            object(
                &["ended", "events", "overflows", "limit"],
                json!({
                    "ended": {"type": "string", "enum": ["channel_closed", "sandbox_stopped"]},
                    "events": {"type": "integer", "minimum": 0, "description": "Event lines streamed"},
                    "overflows": {"type": "integer", "minimum": 0, "description": "Overflow lines streamed (events were lost there)"},
                    "limit": {"description": "{code: \"S400\", message} when the watch reached its directory limit", "oneOf": [{"type": "object"}, {"type": "null"}]},
                }),
            ),
        ),
    ]
}

fn watch_request() -> Value {
    let mut stream = crate::ops::stream::schema("write");
    stream["description"] = "Write end of a channel from engine::channels::create: a line \
        {\"kind\":\"ready\"} once the watch is in place, then one line per event \
        {path, kind, is_dir} (moved: from, to), {\"kind\":\"overflow\"} where events were \
        lost; closing its read end ends the watch"
        .into();
    path_request(
        &["stream"],
        json!({
            "recursive": flag("Watch every directory below too (never through a symbolic link), and new ones as they appear"),
            "max_dirs": {"type": "integer", "minimum": 1, "maximum": agent_proto::MAX_WATCH_DIRS, "description": "Directories a recursive watch holds at most (default and largest 8192; all watches of a sandbox share one pool of 8192); past it a `limit` line"},
            "stream": stream,
        }),
    )
}

fn globs(what: &str) -> Value {
    json!({
        "type": "array",
        "items": {"type": "string"},
        "default": [],
        "description": format!("{what}: a glob without `/` matches the file name, one with `/` the path relative to `path` (`*` stays within one directory, `**` crosses them)"),
    })
}

fn recursive() -> Value {
    json!({"type": "boolean", "default": true, "description": "Descend into subdirectories (symlinks are never followed); false: only the directory's own files"})
}

fn grep_request() -> Value {
    path_request(
        &["pattern"],
        json!({
            "pattern": {"type": "string", "description": "Regex (Rust regex syntax), matched against each line"},
            "recursive": recursive(),
            "ignore_case": flag("Match case-insensitively"),
            "include_glob": globs("Only files matching one of these"),
            "exclude_glob": globs("Skip files and directories matching one of these"),
            "max_matches": {"type": "integer", "minimum": 1, "maximum": GREP_MAX_MATCHES, "default": GREP_DEFAULT_MATCHES},
            "max_line_bytes": {"type": "integer", "minimum": 0, "maximum": GREP_MAX_LINE_BYTES, "default": GREP_DEFAULT_LINE_BYTES},
        }),
    )
}

fn sed_request() -> Value {
    let mut schema = object(
        &["sandbox_id", "pattern", "replacement"],
        json!({
            "sandbox_id": uuid_schema(),
            "files": {"type": "array", "items": guest_path(), "minItems": 1, "maxItems": SED_MAX_FILES, "description": "The files to edit (symlinks among them are refused)"},
            "path": {"type": "string", "pattern": "^/", "description": "A file, or a directory whose files are edited (binary files and symlinks skipped)"},
            "pattern": {"type": "string", "minLength": 1, "description": "Regex (or literal text with regex: false); ^ and $ match at line boundaries"},
            "replacement": {"type": "string", "description": "With regex: true, $1 / ${name} insert capture groups ($$ is a literal $); literal otherwise"},
            "regex": {"type": "boolean", "default": true},
            "first_only": flag("Replace only the first match of each file"),
            "ignore_case": flag("Match case-insensitively"),
            "recursive": recursive(),
            "include_glob": globs("With `path`: only files matching one of these"),
            "exclude_glob": globs("With `path`: skip files and directories matching one of these"),
        }),
    );
    schema["oneOf"] = json!([{"required": ["files"]}, {"required": ["path"]}]);
    schema
}

/// `sandbox_id` + `path`, plus `more` properties; `extra_required` beyond those two.
fn path_request(extra_required: &[&str], more: Value) -> Value {
    let mut required = vec!["sandbox_id", "path"];
    required.extend_from_slice(extra_required);
    let mut properties = json!({"sandbox_id": uuid_schema(), "path": guest_path()});
    if let (Some(all), Value::Object(more)) = (properties.as_object_mut(), more) {
        all.extend(more);
    }
    object(&required, properties)
}

fn write_request() -> Value {
    let mut schema = path_request(
        &[],
        json!({
            "content": {"description": "UTF-8 text to write, or the read end of an engine channel carrying the bytes (any size)", "oneOf": [{"type": "string"}, channel_ref()]},
            "content_b64": {"type": "string", "contentEncoding": "base64", "description": "Bytes to write, base64"},
            "mode": mode("0644"),
            "parents": flag("Create missing parent directories"),
        }),
    );
    schema["oneOf"] = json!([{"required": ["content"]}, {"required": ["content_b64"]}]);
    schema
}

fn read_response() -> Value {
    object(
        &["content", "size", "mode", "mtime"],
        json!({
            "content": {"description": "Read end of an engine channel carrying the file's bytes (null only when the adapter runs without an engine connection and `body` holds the file)", "oneOf": [channel_ref(), {"type": "null"}]},
            "body": {"type": "string", "description": "The file's text, present for UTF-8 files up to 1 MiB"},
            "size": count(),
            "mode": mode_pattern(),
            "mtime": mtime(),
        }),
    )
}

fn channel_ref() -> Value {
    object(
        &["channel_id", "access_key", "direction"],
        json!({
            "channel_id": {"type": "string"},
            "access_key": {"type": "string"},
            "direction": {"type": "string", "enum": ["read", "write"]},
        }),
    )
}

fn entry() -> Value {
    object(
        &["name", "is_dir", "is_symlink", "size", "mode", "mtime"],
        json!({
            "name": {"type": "string"},
            "is_dir": {"type": "boolean"},
            "is_symlink": {"type": "boolean"},
            "size": count(),
            "mode": mode_pattern(),
            "mtime": mtime(),
        }),
    )
}

fn guest_path() -> Value {
    json!({"type": "string", "pattern": "^/", "description": "Absolute path inside the sandbox"})
}

fn mode_pattern() -> Value {
    json!({"type": "string", "pattern": "^[0-7]{3,4}$", "description": "Octal permission bits, e.g. \"0755\""})
}

fn mode(default: &str) -> Value {
    let mut schema = mode_pattern();
    schema["default"] = json!(default);
    schema
}

fn flag(description: &str) -> Value {
    json!({"type": "boolean", "default": false, "description": description})
}

fn count() -> Value {
    json!({"type": "integer", "minimum": 0})
}

fn mtime() -> Value {
    json!({"type": "integer", "description": "Seconds since the Unix epoch"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fs_function_has_object_schemas_naming_its_required_fields() {
        let specs = specs();
        assert_eq!(specs.len(), 11);
        for (id, _, request, response) in specs {
            assert_eq!(request["type"], "object", "{id}");
            assert_eq!(response["type"], "object", "{id}");
            let required = request["required"].as_array().unwrap();
            assert!(required.contains(&json!("sandbox_id")), "{id}");
            for field in required {
                let name = field.as_str().unwrap();
                assert!(request["properties"].get(name).is_some(), "{id}: {name}");
            }
        }
    }
}
