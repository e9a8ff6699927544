//! `fs::grep` and `fs::sed`: parsing and response shaping; the search and the atomic
//! rewrites are the agent's (`FsRequest::Grep` / `FsRequest::Sed`).
//!
//! Choices: knobs out of range (`max_matches` outside 1..=100000, `max_line_bytes` above
//! 65536, more than 4000 `files`) and a sed `pattern` that is empty (it would insert the
//! replacement between every byte) are S001, like any payload-shape error; relative paths
//! are S210. Errors from the agent: S217 a bad regex or glob, S211 a missing `path`.

use std::sync::Arc;

use agent_proto::fs::{
    SedTarget, GREP_DEFAULT_LINE_BYTES, GREP_DEFAULT_MATCHES, GREP_MAX_LINE_BYTES,
    GREP_MAX_MATCHES, SED_MAX_FILES,
};
use agent_proto::{FsRequest, FsResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{begin, guest_path, on_agent, unexpected};
use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::request::parse;

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
struct GrepRequest {
    sandbox_id: String,
    path: String,
    pattern: String,
    #[serde(default = "yes")]
    recursive: bool,
    #[serde(default)]
    ignore_case: bool,
    #[serde(default)]
    include_glob: Vec<String>,
    #[serde(default)]
    exclude_glob: Vec<String>,
    max_matches: Option<u64>,
    max_line_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct SedRequest {
    sandbox_id: String,
    files: Option<Vec<String>>,
    path: Option<String>,
    pattern: String,
    replacement: String,
    #[serde(default = "yes")]
    regex: bool,
    #[serde(default)]
    first_only: bool,
    #[serde(default)]
    ignore_case: bool,
    #[serde(default = "yes")]
    recursive: bool,
    #[serde(default)]
    include_glob: Vec<String>,
    #[serde(default)]
    exclude_glob: Vec<String>,
}

pub async fn grep<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: GrepRequest = parse(payload)?;
    let id = request.sandbox_id.clone();
    let op = grep_op(request)?;
    let (sandbox, _call) = begin(plugin, &id).await?;
    match on_agent(&sandbox, op).await? {
        FsResponse::Matches { matches, truncated } => Ok(json!({
            "matches": matches
                .into_iter()
                .map(|m| json!({"path": m.path, "line": m.line, "content": m.content}))
                .collect::<Vec<_>>(),
            "truncated": truncated,
        })),
        other => Err(unexpected("grep", &other)),
    }
}

pub async fn sed<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: SedRequest = parse(payload)?;
    let id = request.sandbox_id.clone();
    let op = sed_op(request)?;
    let (sandbox, _call) = begin(plugin, &id).await?;
    match on_agent(&sandbox, op).await? {
        FsResponse::Replaced {
            results,
            total_replacements,
        } => Ok(json!({
            "results": results
                .into_iter()
                .map(|r| {
                    let mut row = Map::new();
                    row.insert("path".into(), json!(r.path));
                    row.insert("replacements".into(), json!(r.replacements));
                    row.insert("success".into(), json!(r.success));
                    if let Some(error) = r.error {
                        row.insert("error".into(), json!(error));
                    }
                    Value::Object(row)
                })
                .collect::<Vec<_>>(),
            "total_replacements": total_replacements,
        })),
        other => Err(unexpected("sed", &other)),
    }
}

fn grep_op(request: GrepRequest) -> Result<FsRequest, SandboxError> {
    let max_matches = request.max_matches.unwrap_or(GREP_DEFAULT_MATCHES);
    if !(1..=GREP_MAX_MATCHES).contains(&max_matches) {
        return Err(SandboxError::InvalidRequest(format!(
            "`max_matches` must be between 1 and {GREP_MAX_MATCHES}, got {max_matches}"
        )));
    }
    let max_line_bytes = request.max_line_bytes.unwrap_or(GREP_DEFAULT_LINE_BYTES);
    if max_line_bytes > GREP_MAX_LINE_BYTES {
        return Err(SandboxError::InvalidRequest(format!(
            "`max_line_bytes` must be at most {GREP_MAX_LINE_BYTES}, got {max_line_bytes}"
        )));
    }
    guest_path("path", &request.path)?;
    Ok(FsRequest::Grep {
        path: request.path,
        pattern: request.pattern,
        recursive: request.recursive,
        ignore_case: request.ignore_case,
        include_glob: request.include_glob,
        exclude_glob: request.exclude_glob,
        max_matches,
        max_line_bytes,
    })
}

fn sed_op(request: SedRequest) -> Result<FsRequest, SandboxError> {
    let target = match (request.files, request.path) {
        (Some(files), None) => {
            if files.is_empty() || files.len() > SED_MAX_FILES {
                return Err(SandboxError::InvalidRequest(format!(
                    "`files` must name 1 to {SED_MAX_FILES} files, got {}",
                    files.len()
                )));
            }
            for file in &files {
                guest_path("files", file)?;
            }
            SedTarget::Files(files)
        }
        (None, Some(path)) => {
            guest_path("path", &path)?;
            SedTarget::Tree(path)
        }
        (Some(_), Some(_)) => {
            return Err(SandboxError::InvalidRequest(
                "give exactly one of `files` and `path`, not both".into(),
            ))
        }
        (None, None) => {
            return Err(SandboxError::InvalidRequest(
                "missing `files` or `path`".into(),
            ))
        }
    };
    if request.pattern.is_empty() {
        return Err(SandboxError::InvalidRequest(
            "`pattern` must not be empty".into(),
        ));
    }
    Ok(FsRequest::Sed {
        target,
        pattern: request.pattern,
        replacement: request.replacement,
        regex: request.regex,
        first_only: request.first_only,
        ignore_case: request.ignore_case,
        recursive: request.recursive,
        include_glob: request.include_glob,
        exclude_glob: request.exclude_glob,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "00000000-0000-4000-8000-000000000000";

    fn grep_of(fields: Value) -> Result<FsRequest, SandboxError> {
        let mut payload = json!({"sandbox_id": ID, "path": "/src", "pattern": "x"});
        if let (Some(base), Value::Object(more)) = (payload.as_object_mut(), fields) {
            base.extend(more);
        }
        grep_op(parse(payload)?)
    }

    fn sed_of(fields: Value) -> Result<FsRequest, SandboxError> {
        let mut payload = json!({"sandbox_id": ID, "pattern": "a", "replacement": "b"});
        if let (Some(base), Value::Object(more)) = (payload.as_object_mut(), fields) {
            base.extend(more);
        }
        sed_op(parse(payload)?)
    }

    #[test]
    fn grep_defaults_and_bounds() {
        let FsRequest::Grep {
            recursive,
            ignore_case,
            max_matches,
            max_line_bytes,
            include_glob,
            ..
        } = grep_of(json!({})).unwrap()
        else {
            panic!("not a grep")
        };
        assert!(recursive && !ignore_case && include_glob.is_empty());
        assert_eq!((max_matches, max_line_bytes), (10_000, 4096));
        assert!(grep_of(json!({"max_matches": 100_000, "max_line_bytes": 0})).is_ok());
        for bad in [
            json!({"max_matches": 0}),
            json!({"max_matches": 100_001}),
            json!({"max_matches": -1}),
            json!({"max_line_bytes": 65_537}),
            json!({"pattern": 5}),
            json!({"include_glob": "*.rs"}),
            json!({"recursive": "yes"}),
        ] {
            assert_eq!(grep_of(bad.clone()).unwrap_err().code(), "S001", "{bad}");
        }
        assert_eq!(grep_of(json!({"path": "src"})).unwrap_err().code(), "S210");
    }

    #[test]
    fn sed_takes_exactly_one_target() {
        let Ok(FsRequest::Sed {
            target,
            regex,
            recursive,
            first_only,
            ..
        }) = sed_of(json!({"path": "/src"}))
        else {
            panic!("not a sed")
        };
        assert_eq!(target, SedTarget::Tree("/src".into()));
        assert!(regex && recursive && !first_only);
        let Ok(FsRequest::Sed { target, .. }) = sed_of(json!({"files": ["/a", "/b"]})) else {
            panic!("not a sed")
        };
        assert_eq!(target, SedTarget::Files(vec!["/a".into(), "/b".into()]));
        for bad in [
            json!({}),
            json!({"path": "/a", "files": ["/b"]}),
            json!({"files": []}),
            json!({"files": "/a"}),
            json!({"path": "/a", "pattern": ""}),
            json!({"path": "/a", "replacement": null}),
        ] {
            assert_eq!(sed_of(bad.clone()).unwrap_err().code(), "S001", "{bad}");
        }
        assert_eq!(sed_of(json!({"path": "a"})).unwrap_err().code(), "S210");
        assert_eq!(
            sed_of(json!({"files": ["/a", "b"]})).unwrap_err().code(),
            "S210"
        );
    }
}
