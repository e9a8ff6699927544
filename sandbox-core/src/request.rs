//! Parsing of request payloads: every malformed payload becomes S001 with a reason that names
//! the field, never a panic. Unknown fields are accepted (the engine adds `_caller_worker_id`).

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use crate::error::SandboxError;

/// The longest `idle_timeout_secs` a create may ask: a week. Longer is a sandbox nobody
/// watches; and far larger values overflow the clocks they are added to.
pub const MAX_IDLE_TIMEOUT_SECS: u64 = 7 * 24 * 3600;
/// An `env` variable's name at most (glibc and the shells have no limit of their own; no
/// real name comes near it).
pub const MAX_ENV_NAME_BYTES: usize = 256;
/// An `env` variable's value at most: Linux refuses longer strings at execve
/// (`MAX_ARG_STRLEN`, 32 pages), so a longer one could never reach a program anyway.
pub const MAX_ENV_VALUE_BYTES: usize = 128 * 1024;
/// All of one request's `env` together (names, values, one byte each for `=`), and how many
/// variables: an exec travels to the agent in one 1 MiB frame, with its argv beside it.
pub const MAX_ENV_TOTAL_BYTES: usize = 512 * 1024;
pub const MAX_ENV_VARS: usize = 4096;

/// `text` shortened for an error message: a refused field may be huge, or a secret.
fn shown(text: &str) -> String {
    const MOST: usize = 40;
    if text.len() <= MOST {
        return format!("{text:?}");
    }
    let mut end = MOST;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &text[..end], text.len())
}

/// Deserialises a request object; the error names what is wrong.
pub fn parse<T: DeserializeOwned>(payload: Value) -> Result<T, SandboxError> {
    if !payload.is_object() {
        return Err(SandboxError::InvalidRequest(
            "the request must be a JSON object".into(),
        ));
    }
    serde_json::from_value(payload).map_err(|e| SandboxError::InvalidRequest(e.to_string()))
}

/// `env` as `["K=V", ...]` or `{"K": "V"}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EnvInput {
    List(Vec<String>),
    Map(BTreeMap<String, String>),
}

/// Accepts either `env` shape and checks every name.
pub fn env_pairs(env: Option<Value>) -> Result<Vec<(String, String)>, SandboxError> {
    let Some(env) = env else {
        return Ok(Vec::new());
    };
    if env.is_null() {
        return Ok(Vec::new());
    }
    let input: EnvInput = serde_json::from_value(env).map_err(|_| {
        SandboxError::InvalidRequest(
            "`env` must be an array of \"K=V\" strings or an object of string values".into(),
        )
    })?;
    let pairs: Vec<(String, String)> = match input {
        EnvInput::List(items) => items
            .into_iter()
            .map(|item| match item.split_once('=') {
                Some((k, v)) => Ok((k.to_string(), v.to_string())),
                None => Err(SandboxError::InvalidRequest(format!(
                    "`env` entry {} is not K=V",
                    shown(&item)
                ))),
            })
            .collect::<Result<_, _>>()?,
        EnvInput::Map(map) => map.into_iter().collect(),
    };
    check_env(&pairs)?;
    Ok(pairs)
}

/// Names and values well formed and within the ceilings (`MAX_ENV_*`).
fn check_env(pairs: &[(String, String)]) -> Result<(), SandboxError> {
    let invalid = |why: String| Err(SandboxError::InvalidRequest(why));
    if pairs.len() > MAX_ENV_VARS {
        return invalid(format!(
            "`env` has {} variables, more than {MAX_ENV_VARS}",
            pairs.len()
        ));
    }
    let mut total = 0usize;
    for (name, value) in pairs {
        let bad_name = name.is_empty() || name.contains('=') || name.contains('\0');
        if bad_name || value.contains('\0') {
            return invalid(format!("`env` has an invalid variable {}", shown(name)));
        }
        if name.len() > MAX_ENV_NAME_BYTES {
            return invalid(format!(
                "`env` variable {} has a name over {MAX_ENV_NAME_BYTES} bytes",
                shown(name)
            ));
        }
        if value.len() > MAX_ENV_VALUE_BYTES {
            return invalid(format!(
                "`env` variable {} has a value of {} bytes, over {} KiB",
                shown(name),
                value.len(),
                MAX_ENV_VALUE_BYTES >> 10
            ));
        }
        total += name.len() + 1 + value.len();
    }
    if total > MAX_ENV_TOTAL_BYTES {
        return invalid(format!(
            "`env` totals {total} bytes, over {} KiB",
            MAX_ENV_TOTAL_BYTES >> 10
        ));
    }
    Ok(())
}

pub fn sandbox_id(text: &str) -> Result<Uuid, SandboxError> {
    Uuid::parse_str(text)
        .map_err(|_| SandboxError::InvalidRequest(format!("`sandbox_id` {text:?} is not a UUID")))
}

/// `stdin` in base64 (standard alphabet, padding optional).
pub fn stdin_bytes(stdin: Option<&str>) -> Result<Vec<u8>, SandboxError> {
    let Some(text) = stdin else {
        return Ok(Vec::new());
    };
    let trimmed = text.trim_end_matches('=');
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(trimmed)
        .map_err(|e| SandboxError::InvalidRequest(format!("`stdin` is not base64: {e}")))
}

/// The three command shapes of `exec`: `argv[]`, `cmd` + `args[]`, or a `cmd` line split like
/// a shell does (quotes and backslashes, no expansion).
pub fn command(
    argv: Option<Vec<String>>,
    cmd: Option<String>,
    args: Option<Vec<String>>,
) -> Result<Vec<String>, SandboxError> {
    let argv = match (argv, cmd, args) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(SandboxError::InvalidRequest(
                "give either `argv` or `cmd`/`args`, not both".into(),
            ))
        }
        (Some(argv), None, None) => argv,
        (None, Some(cmd), Some(args)) => std::iter::once(cmd).chain(args).collect(),
        (None, Some(line), None) => shlex::split(&line).ok_or_else(|| {
            SandboxError::InvalidRequest(format!(
                "`cmd` {line:?} has an unclosed quote or a trailing backslash"
            ))
        })?,
        (None, None, Some(_)) => {
            return Err(SandboxError::InvalidRequest("`args` needs `cmd`".into()))
        }
        (None, None, None) => {
            return Err(SandboxError::InvalidRequest(
                "missing command: give `argv`, or `cmd` (and `args`)".into(),
            ))
        }
    };
    match argv.first() {
        None => Err(SandboxError::InvalidRequest("the command is empty".into())),
        Some(program) if program.is_empty() => Err(SandboxError::InvalidRequest(
            "the program name is empty".into(),
        )),
        _ if argv.iter().any(|a| a.contains('\0')) => Err(SandboxError::InvalidRequest(
            "the command contains a NUL byte".into(),
        )),
        _ => Ok(argv),
    }
}

/// A path inside the sandbox: absolute, no NUL.
pub fn guest_path(field: &str, path: &str) -> Result<String, SandboxError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(SandboxError::InvalidRequest(format!(
            "`{field}` must be an absolute path, got {path:?}"
        )));
    }
    Ok(path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn env_accepts_both_shapes_and_refuses_bad_names() {
        assert_eq!(
            env_pairs(Some(json!(["A=1", "B=x=y"]))).unwrap(),
            vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        assert_eq!(
            env_pairs(Some(json!({"A": "1"}))).unwrap(),
            vec![("A".into(), "1".into())]
        );
        for bad in [
            json!(["A"]),
            json!(["=1"]),
            json!({"A": 1}),
            json!("A=1"),
            json!([1]),
        ] {
            assert!(
                matches!(
                    env_pairs(Some(bad.clone())),
                    Err(SandboxError::InvalidRequest(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn env_ceilings_hold_and_refusals_never_echo_the_input() {
        let at = |name: usize, value: usize| {
            env_pairs(Some(json!({ "N".repeat(name): "v".repeat(value) })))
        };
        assert!(at(MAX_ENV_NAME_BYTES, MAX_ENV_VALUE_BYTES).is_ok());
        for (name, value) in [
            (MAX_ENV_NAME_BYTES + 1, 1),
            (100_000, 1),
            (1, MAX_ENV_VALUE_BYTES + 1),
        ] {
            let error = at(name, value).unwrap_err();
            assert_eq!(error.code(), "S001");
            assert!(error.to_string().len() < 300, "{error}");
        }
        let list = env_pairs(Some(json!(["K".repeat(10_000)]))).unwrap_err();
        assert!(list.to_string().len() < 300, "{list}");
        let many: Vec<String> = (0..=MAX_ENV_VARS).map(|i| format!("V{i}=1")).collect();
        assert_eq!(env_pairs(Some(json!(many))).unwrap_err().code(), "S001");
        let big = "v".repeat(MAX_ENV_VALUE_BYTES);
        let total: Vec<String> = (0..5).map(|i| format!("V{i}={big}")).collect();
        assert_eq!(env_pairs(Some(json!(total))).unwrap_err().code(), "S001");
        let fits: Vec<String> = (0..3).map(|i| format!("V{i}={big}")).collect();
        assert!(env_pairs(Some(json!(fits))).is_ok());
    }

    #[test]
    fn command_shapes() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            command(Some(s(&["ls", "-l"])), None, None).unwrap(),
            s(&["ls", "-l"])
        );
        assert_eq!(
            command(None, Some("ls".into()), Some(s(&["-l"]))).unwrap(),
            s(&["ls", "-l"])
        );
        assert_eq!(
            command(None, Some("echo 'a b' \"$HOME\"".into()), None).unwrap(),
            s(&["echo", "a b", "$HOME"])
        );
        assert!(command(Some(s(&["ls"])), Some("ls".into()), None).is_err());
        assert!(command(Some(s(&["ls"])), None, Some(s(&["x"]))).is_err());
        assert!(command(Some(vec![]), None, None).is_err());
        assert!(command(None, Some("echo 'open".into()), None).is_err());
        assert!(command(None, None, None).is_err());
    }

    #[test]
    fn stdin_is_base64() {
        assert_eq!(stdin_bytes(Some("aGk=")).unwrap(), b"hi");
        assert_eq!(stdin_bytes(Some("aGk")).unwrap(), b"hi");
        assert!(stdin_bytes(Some("***")).is_err());
    }
}
