//! Starting an exec's program: clean environment, own process group, pipes, and the
//! shell's 126/127 conventions for programs that cannot run.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{ChildStderr, ChildStdin, ChildStdout};
use std::sync::Arc;

use agent_proto::{ErrorCode, ExecRequest, RequestError};

use super::launch::{launch, LaunchError, Program};
use super::pty;
use crate::procs::{ExecControl, ProcTable};

/// PATH given to a program whose request does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct Spawned {
    /// Also the process group id.
    pub pid: libc::pid_t,
    pub stdin: Option<ChildStdin>,
    /// On a terminal: its master, where the program's stdout and stderr both arrive.
    pub stdout: ChildStdout,
    /// None on a terminal (merged into `stdout`).
    pub stderr: Option<ChildStderr>,
    /// On a terminal: a copy of its master, for resizing.
    pub terminal: Option<OwnedFd>,
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
    // Everything the terminal needs is made before the program starts, so nothing can
    // fail once it runs.
    let terminal = match req.tty {
        Some(size) => Some(terminal_ends(size, req.stdin)?),
        None => None,
    };
    let mut failed_workdir = None;
    let slave = terminal.as_ref().map(|t| &t.pair.slave);
    let result = table.spawn_registered(control, || match launch(&program, slave) {
        Ok(launched) => Ok((launched.pid, launched)),
        Err(LaunchError::Spawn(e)) => Err(e),
        Err(LaunchError::Workdir(e)) => {
            failed_workdir = Some(e.to_string());
            Err(e)
        }
    });
    match result {
        Ok((pid, launched)) => match (launched.pipes, terminal) {
            (Some(pipes), _) => Ok(Spawned {
                pid,
                stdin: req.stdin.then(|| ChildStdin::from(pipes.stdin)),
                stdout: ChildStdout::from(pipes.stdout),
                stderr: Some(ChildStderr::from(pipes.stderr)),
                terminal: None,
            }),
            (None, Some(ends)) => {
                // The program holds the slave now; the master reads EIO once its side is
                // closed, which is the end of its output.
                drop(ends.pair.slave);
                Ok(Spawned {
                    pid,
                    stdin: ends.stdin.map(ChildStdin::from),
                    stdout: ChildStdout::from(ends.pair.master),
                    stderr: None,
                    terminal: Some(ends.resize),
                })
            }
            // Not reachable (launch makes pipes unless given a terminal); should it ever
            // be, the program is not left running unattended.
            (None, None) => {
                crate::sys::kill_group(pid, libc::SIGKILL);
                Err(request(
                    ErrorCode::SpawnFailed,
                    "the program started without its pipes",
                )
                .into())
            }
        },
        Err(e) => match failed_workdir {
            Some(why) => {
                let dir = req.workdir.as_deref().unwrap_or_default();
                Err(request(ErrorCode::BadWorkdir, format!("{dir}: {why}")).into())
            }
            None => Err(classify(name, e)),
        },
    }
}

/// A terminal's pair and the copies of its master the exec keeps.
struct TerminalEnds {
    pair: pty::Pair,
    stdin: Option<OwnedFd>,
    resize: OwnedFd,
}

fn terminal_ends(size: agent_proto::TtySize, stdin: bool) -> Result<TerminalEnds, SpawnError> {
    let failed = |e: io::Error| {
        SpawnError::from(request(
            ErrorCode::SpawnFailed,
            format!("cannot open a pseudo-terminal: {e}"),
        ))
    };
    let pair = pty::open(size).map_err(failed)?;
    let stdin = match stdin {
        true => Some(pair.master.try_clone().map_err(failed)?),
        false => None,
    };
    let resize = pair.master.try_clone().map_err(failed)?;
    Ok(TerminalEnds {
        pair,
        stdin,
        resize,
    })
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
