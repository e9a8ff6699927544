//! Starting an exec's program: clean environment, own process group, pipes, and the
//! shell's 126/127 conventions for programs that cannot run.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

use agent_proto::{ErrorCode, ExecRequest, RequestError};

use crate::procs::{ExecControl, ProcTable};
use crate::sys;

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
    let command = build(req)?;
    let program = req.argv[0].clone();
    let mut command = command;
    let result = table.spawn_registered(control, || {
        let mut child = command.spawn()?;
        let pid = child.id() as libc::pid_t;
        Ok((
            pid,
            (child.stdin.take(), child.stdout.take(), child.stderr.take()),
        ))
    });
    match result {
        Ok((pid, (stdin, Some(stdout), Some(stderr)))) => Ok(Spawned {
            pid,
            stdin: stdin.filter(|_| req.stdin),
            stdout,
            stderr,
        }),
        Ok((pid, _)) => {
            sys::kill_group(pid, libc::SIGKILL);
            Err(request(ErrorCode::SpawnFailed, "child pipes missing").into())
        }
        Err(e) => Err(classify(&program, e)),
    }
}

fn build(req: &ExecRequest) -> Result<Command, SpawnError> {
    let Some((program, args)) = req.argv.split_first() else {
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
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        // Always a pipe (never /dev/null, which a bare image may lack); closed at once
        // when the request has no stdin.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if !req.env.iter().any(|(k, _)| k == "PATH") {
        command.env("PATH", DEFAULT_PATH);
    }
    if let Some(dir) = &req.workdir {
        if !Path::new(dir).is_dir() {
            return Err(request(ErrorCode::BadWorkdir, format!("{dir}: not a directory")).into());
        }
        command.current_dir(dir);
    }
    // SAFETY: the closure runs in the forked child before exec and only calls prctl,
    // sigprocmask, open, write and close, which are async-signal-safe; it touches no memory
    // shared with other threads.
    unsafe {
        command.pre_exec(|| {
            sys::die_with_parent()?;
            // The program, not the agent, is what the OOM killer ends (the sandbox then
            // keeps serving).
            sys::prefer_as_oom_victim();
            sys::unblock_all_signals()
        });
    }
    Ok(command)
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
