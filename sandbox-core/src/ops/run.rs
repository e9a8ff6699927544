//! `run`: create, write the files and the code, exec the interpreter, stop (unless kept).

use std::sync::Arc;

use agent_proto::FsRequest;
use serde::Deserialize;
use serde_json::Value;

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::ops::create::{create_sandbox, CreateOptions};
use crate::ops::exec::{agent_failure, run_in, streams, ExecInput};
use crate::ops::stop::teardown;
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{env_pairs, parse, stdin_bytes};

/// Where `run` puts the code and relative `files`; also the program's working directory.
const RUN_DIR: &str = "/tmp/iii-run";

#[derive(Debug, Deserialize)]
struct RunRequest {
    image: String,
    code: String,
    lang: String,
    files: Option<Vec<RunFile>>,
    env: Option<Value>,
    stdin: Option<String>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    keep_sandbox: bool,
    /// As `exec`'s: the program's output streamed into the caller's channel.
    stream: Option<Value>,
    stdin_stream: Option<Value>,
    /// As `exec`'s: a pseudo-terminal of `{rows, cols}`.
    tty: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct RunFile {
    path: String,
    content: String,
}

/// The interpreter and the code file's name for a `lang`.
fn interpreter(lang: &str) -> Result<(&str, &'static str), SandboxError> {
    Ok(match lang {
        "python" | "py" => ("python3", "main.py"),
        "node" | "js" | "javascript" => ("node", "main.js"),
        "sh" | "shell" | "bash" => ("/bin/sh", "main.sh"),
        "" => return Err(SandboxError::InvalidRequest("`lang` is empty".into())),
        other if other.contains('\0') => {
            return Err(SandboxError::InvalidRequest("`lang` has a NUL byte".into()))
        }
        other => (other, "main"),
    })
}

pub async fn run<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: RunRequest = parse(payload)?;
    let (program, file_name) = interpreter(&request.lang)?;
    let env = env_pairs(request.env)?;
    let stdin = stdin_bytes(request.stdin.as_deref())?;
    let streams = streams(
        request.stream,
        request.stdin_stream,
        request.stdin.is_some(),
        request.tty,
    )?;
    let files = request.files.unwrap_or_default();
    let files: Vec<(String, String)> = files
        .into_iter()
        .map(|f| Ok((run_path(&f.path)?, f.content)))
        .collect::<Result<_, SandboxError>>()?;

    let sandbox = create_sandbox(
        plugin,
        CreateOptions {
            image: request.image,
            env,
            ..Default::default()
        },
    )
    .await?;
    let code_path = format!("{RUN_DIR}/{file_name}");
    let outcome = async {
        let (_, _call) = plugin.registry.begin_exec(sandbox.id)?;
        for (path, content) in files
            .iter()
            .chain(std::iter::once(&(code_path.clone(), request.code.clone())))
        {
            write_file(&sandbox, path, content.as_bytes()).await?;
        }
        let input = ExecInput {
            argv: vec![program.to_string(), code_path.clone()],
            stdin,
            timeout_ms: request.timeout_ms,
            workdir: Some(RUN_DIR.to_string()),
            streams,
            ..Default::default()
        };
        run_in(plugin, &sandbox, input).await
    }
    .await;

    // A kept sandbox is only worth keeping when the caller learns its id: on an error (a
    // timeout, a failed write) it goes like any other.
    match outcome {
        Ok(mut result) if request.keep_sandbox => {
            result["sandbox_id"] = Value::String(sandbox.id.to_string());
            Ok(result)
        }
        outcome => {
            if let Ok(Some(sandbox)) = plugin.registry.take(sandbox.id, false) {
                plugin.events.emit(|| {
                    crate::events::Event::stopped(sandbox.id, crate::events::StopReason::Caller)
                });
                teardown(plugin, sandbox).await;
            }
            outcome
        }
    }
}

/// Relative `files` paths land in the run directory; absolute ones stay where they say.
fn run_path(path: &str) -> Result<String, SandboxError> {
    if path.is_empty() || path.contains('\0') {
        return Err(SandboxError::InvalidRequest(format!(
            "`files` path {path:?} is invalid"
        )));
    }
    Ok(if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{RUN_DIR}/{path}")
    })
}

async fn write_file(sandbox: &Sandbox, path: &str, data: &[u8]) -> Result<(), SandboxError> {
    let request = FsRequest::Write {
        path: path.to_string(),
        mode: 0o644,
        parents: true,
        append: false,
        data: data.to_vec(),
    };
    match sandbox.agent.fs(request).await {
        Ok(_) => Ok(()),
        Err(e) => Err(agent_failure(sandbox, e).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_map_to_interpreters() {
        assert_eq!(interpreter("py").unwrap().0, "python3");
        assert_eq!(interpreter("javascript").unwrap().0, "node");
        assert_eq!(interpreter("bash").unwrap().0, "/bin/sh");
        assert_eq!(interpreter("/usr/bin/ruby").unwrap().0, "/usr/bin/ruby");
        assert!(interpreter("").is_err());
    }

    #[test]
    fn relative_files_go_to_the_run_dir() {
        assert_eq!(run_path("data.txt").unwrap(), "/tmp/iii-run/data.txt");
        assert_eq!(run_path("/etc/x").unwrap(), "/etc/x");
        assert!(run_path("").is_err());
    }
}
