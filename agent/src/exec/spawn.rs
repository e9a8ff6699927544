//! Starting an exec's program: clean environment, own process group, pipes, and the
//! shell's 126/127 conventions for programs that cannot run.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::process::{ChildStderr, ChildStdin, ChildStdout};
use std::sync::Arc;

use agent_proto::{ErrorCode, ExecRequest, RequestError};

use super::launch::{launch, LaunchError, Program};
use crate::procs::{ExecControl, ProcTable};

/// PATH given to a program whose request does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct Spawned {
    /// Also the process group id.
    pub pid: libc::pid_t,
    pub stdin: Option<ChildStdin>,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
}

/// Why nothing runs.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program cannot run: reported as its exit code, like a shell would.
    #[error("{message}")]
    AsExit { code: i32, message: String },
    /// The request itself is wrong or the system refused: reported as a request error.
    #[error(transparent)]
    Request(#[from] RequestError),
}

pub fn spawn(
    req: &ExecRequest,
    control: &Arc<ExecControl>,
    table: &ProcTable,
) -> Result<Spawned, SpawnError> {
    let program = build(req)?;
    let name = &req.argv[0];
    let mut failed_workdir = None;
    let result = table.spawn_registered(control, || match launch(&program) {
        Ok(launched) => Ok((launched.pid, launched)),
        Err(LaunchError::Spawn(e)) => Err(e),
        Err(LaunchError::Workdir(e)) => {
            failed_workdir = Some(e.to_string());
            Err(e)
        }
    });
    match result {
        Ok((pid, launched)) => Ok(Spawned {
            pid,
            stdin: req.stdin.then(|| ChildStdin::from(launched.stdin)),
            stdout: ChildStdout::from(launched.stdout),
            stderr: ChildStderr::from(launched.stderr),
        }),
        Err(e) => match failed_workdir {
            Some(why) => {
                let dir = req.workdir.as_deref().unwrap_or_default();
                Err(request(ErrorCode::BadWorkdir, format!("{dir}: {why}")).into())
            }
            None => Err(classify(name, e)),
        },
    }
}

fn build(req: &ExecRequest) -> Result<Program, SpawnError> {
    let Some(program) = req.argv.first() else {
        return Err(request(ErrorCode::BadRequest, "argv is empty").into());
    };
    if program.is_empty() {
        return Err(request(ErrorCode::BadRequest, "argv[0] is empty").into());
    }
    for (key, _) in &req.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(request(ErrorCode::BadRequest, format!("bad env name {key:?}")).into());
        }
    }
    let env = program_env(&req.env);
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    if let Some(dir) = &req.workdir {
        if !Path::new(dir).is_dir() {
            return Err(request(ErrorCode::BadWorkdir, format!("{dir}: not a directory")).into());
        }
    }
    Program::new(&req.argv, &env, path, req.workdir.as_deref())
        .map_err(|e| request(ErrorCode::BadRequest, format!("{program}: {e}")).into())
}

/// The program's environment: each name once, a later entry overriding an earlier one (the
/// adapter sends the sandbox's env, then the exec's), and PATH when the request has none.
fn program_env(requested: &[(String, String)]) -> Vec<(String, String)> {
    // An index by name: a request may hold many thousands of entries.
    let mut at: HashMap<&str, usize> = HashMap::with_capacity(requested.len());
    let mut env: Vec<(String, String)> = Vec::with_capacity(requested.len() + 1);
    for (key, value) in requested {
        match at.get(key.as_str()) {
            Some(&i) => env[i].1.clone_from(value),
            None => {
                at.insert(key, env.len());
                env.push((key.clone(), value.clone()));
            }
        }
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    env
}

fn classify(program: &str, err: io::Error) -> SpawnError {
    let raw = err.raw_os_error();
    match raw {
        Some(libc::ENOENT) => SpawnError::AsExit {
            code: 127,
            message: format!("sandbox-agent: {program}: command not found\n"),
        },
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::ENOEXEC) | Some(libc::EISDIR) => {
            SpawnError::AsExit {
                code: 126,
                message: format!("sandbox-agent: {program}: cannot execute: {err}\n"),
            }
        }
        _ if err.kind() == io::ErrorKind::InvalidInput => {
            request(ErrorCode::BadRequest, format!("{program}: {err}")).into()
        }
        _ => request(ErrorCode::SpawnFailed, format!("{program}: {err}")).into(),
    }
}

fn request(code: ErrorCode, message: impl Into<String>) -> RequestError {
    RequestError::new(code, message)
}
