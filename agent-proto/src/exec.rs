//! Exec messages: what the host asks the agent to run, and how it ended.

use serde::{Deserialize, Serialize};

/// The head of an exec (frame `ExecStart`). Stdin bytes follow as `Stdin` frames when
/// `stdin` is true; output comes back as raw `Stdout`/`Stderr` frames, `ExecExit` last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Program and arguments, run directly (no shell). `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// The whole environment of the program; the agent adds a default `PATH` if absent.
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    /// Whether `Stdin` frames follow. If false, the program's stdin is closed at once.
    pub stdin: bool,
    /// Wall-clock limit; the process group is killed at the deadline. 0 means no limit.
    pub timeout_ms: u64,
    /// Bytes sent at most per output stream; the rest is drained and dropped.
    pub max_output_bytes: u64,
    /// Flow control, only to an agent whose `Hello` lists [`FEATURE_EXEC_FLOW`]. When set,
    /// the agent keeps at most this many cost units ([`flow_cost`]) of output sent but not
    /// yet acknowledged by `OutputAck` (it stops reading the program's pipes meanwhile, so
    /// the program blocks), and acknowledges each stdin chunk it has written to the program
    /// with `StdinAck` (the host keeps at most a window of stdin in flight). Absent: no
    /// acknowledgements either way, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_window: Option<u64>,
    /// A terminal, only to an agent whose `Hello` lists [`FEATURE_EXEC_TTY`]: the program
    /// runs in a session of its own on a new pseudo-terminal of this size (its controlling
    /// terminal, on its stdin, stdout and stderr). Its output comes as `Stdout` frames
    /// only (the terminal merges stderr), `Stdin` frames are typed at the terminal, and
    /// `Resize` frames change its size. Absent: pipes, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<TtySize>,
}

/// The `Hello` feature of an agent that honours [`ExecRequest::tty`] and knows the
/// `Resize` frame. Hosts never send either to an agent without it.
pub const FEATURE_EXEC_TTY: &str = "exec_tty";

/// A terminal's size in character cells (payload of `Resize`, host to agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    pub rows: u16,
    pub cols: u16,
}

/// The `Hello` feature of an agent that honours [`ExecRequest::flow_window`] and knows the
/// `OutputAck`/`StdinAck` frames. Hosts never send those to an agent without it.
pub const FEATURE_EXEC_FLOW: &str = "exec_flow";

/// Per-chunk overhead counted against a flow window, so a stream of tiny chunks is
/// bounded in count as well as in bytes.
pub const FLOW_CHUNK_OVERHEAD: u64 = 64;

/// What one chunk of `len` payload bytes costs against a flow window.
pub fn flow_cost(len: usize) -> u64 {
    len as u64 + FLOW_CHUNK_OVERHEAD
}

/// Payload of `OutputAck` (host to agent: output consumed) and `StdinAck` (agent to host:
/// stdin written to the program), in cost units ([`flow_cost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowAck {
    pub bytes: u64,
}

/// The end of an exec (frame `ExecExit`), sent after both output streams are drained
/// (or abandoned at the deadline).
///
/// Timing rules: the deadline counts from the spawn. If the program exits but a
/// background child keeps a pipe open, the agent keeps draining until EOF or the
/// deadline; at the deadline it kills the group and reports `timed_out: true` with the
/// program's own `exit_code` and the output read so far. Programs left running in the
/// background with their output redirected are not killed when the exec ends normally.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecExit {
    /// Exit status; `128 + signal` when killed by a signal; 127 missing program,
    /// 126 not executable (the shell's conventions).
    pub exit_code: i32,
    /// The signal that ended the program, if any.
    pub signal: Option<i32>,
    /// The deadline passed before the program exited and its output closed.
    pub timed_out: bool,
    /// Killed because the host asked (`ExecKill`) or the agent is shutting down.
    pub killed: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Bytes the program wrote per stream, including what was dropped past the cap.
    pub stdout_total: u64,
    pub stderr_total: u64,
    pub duration_ms: u64,
}

/// What the host-side caller asks for (see `AgentClient::exec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub stdin: Vec<u8>,
    pub timeout_ms: u64,
    /// Per stream.
    pub max_output_bytes: usize,
    /// Run on a pseudo-terminal of this size (see [`ExecRequest::tty`]).
    pub tty: Option<TtySize>,
}

/// What the host-side caller gets back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutcome {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub exit_code: i32,
    pub timed_out: bool,
    pub duration_ms: u64,
}

impl ExecSpec {
    /// The wire head for this spec.
    pub fn to_request(&self) -> ExecRequest {
        ExecRequest {
            argv: self.argv.clone(),
            env: self.env.clone(),
            workdir: self.workdir.clone(),
            stdin: !self.stdin.is_empty(),
            timeout_ms: self.timeout_ms,
            max_output_bytes: self.max_output_bytes as u64,
            flow_window: None,
            tty: self.tty,
        }
    }
}
