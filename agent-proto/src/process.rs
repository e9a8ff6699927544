//! Signals to a running exec, and background processes: programs the agent starts and
//! keeps, whose output it holds in bounded rings for the host to page through.
//!
//! Wire: `ExecSignal` (host to agent, on a running exec's id) sends a signal to the exec's
//! process group; unless it is SIGKILL, the agent sends SIGKILL [`SIGNAL_GRACE`] later if
//! the program has not ended by then. Nothing answers it: the exec's `ExecExit` says how it
//! ended (`killed: true`). Only to an agent whose `Hello` lists [`FEATURE_EXEC_SIGNAL`].
//!
//! `ProcRequest` (host to agent) is answered by exactly one `ProcReply`; an
//! [`ProcRequest::Output`] answer is preceded by the bytes as `Data` frames (at most
//! [`MAX_OUTPUT_PAGE`] in all). Only to an agent whose `Hello` lists [`FEATURE_PROCESSES`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ExecRequest;

/// The `Hello` feature of an agent that knows `ExecSignal`.
pub const FEATURE_EXEC_SIGNAL: &str = "exec_signal";

/// The `Hello` feature of an agent that knows `ProcRequest` / `ProcReply`.
pub const FEATURE_PROCESSES: &str = "processes";

/// Between a signal other than SIGKILL and the SIGKILL that follows it.
pub const SIGNAL_GRACE: Duration = Duration::from_secs(2);

/// The signals a host may send (TERM, KILL, INT, HUP, QUIT): the agent refuses others.
pub const ALLOWED_SIGNALS: [i32; 5] = [15, 9, 2, 1, 3];

/// Background processes one agent keeps running at once; one more is `TooMany`.
pub const MAX_LIVE_PROCESSES: usize = 32;

/// Ended background processes the agent remembers (their exit and output) besides the
/// running ones; the oldest ended one is forgotten past it.
pub const MAX_ENDED_PROCESSES: usize = 32;

/// Output kept per process: its last bytes, older ones dropped.
pub const RING_BYTES: usize = 1024 * 1024;

/// Output kept across every process of the agent.
pub const RINGS_TOTAL_BYTES: usize = 4 * 1024 * 1024;

/// Bytes one `Output` answer carries at most (the host pages with `since`).
pub const MAX_OUTPUT_PAGE: u32 = 512 * 1024;

/// Payload of `ExecSignal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSignal {
    pub signal: i32,
}

/// Payload of `ProcRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ProcRequest {
    /// Start `exec` in the background (its stdin closed; `timeout_ms`, `max_output_bytes`,
    /// `flow_window` and `tty` are ignored). Answered by `Started` once it runs.
    Start { exec: ExecRequest },
    /// Every process the agent keeps, running and ended.
    List,
    /// Output from absolute offset `since` (bytes the process wrote, both streams
    /// interleaved as read), at most `max_bytes` (capped at [`MAX_OUTPUT_PAGE`]).
    Output {
        process_id: u32,
        since: u64,
        max_bytes: u32,
    },
    /// Signal the process's group (SIGKILL [`SIGNAL_GRACE`] later unless it ends).
    Kill { process_id: u32, signal: i32 },
}

/// What the agent says about one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub process_id: u32,
    pub pid: i32,
    pub running: bool,
    /// Once ended: its status (`128 + signal` when a signal ended it).
    pub exit_code: Option<i32>,
    /// Bytes it wrote in all (the ring keeps the last of them).
    pub total_bytes: u64,
}

/// Why a `ProcRequest` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcErrorCode {
    NotFound,
    TooMany,
    BadSignal,
    /// The program could not start (the message says why).
    Spawn,
}

/// Payload of `ProcReply`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ProcReply {
    Started {
        info: ProcInfo,
    },
    List {
        processes: Vec<ProcInfo>,
    },
    /// The `Data` frames before it carried bytes `start..next`; `start > since` means bytes
    /// between were dropped from the ring before they were read.
    Output {
        info: ProcInfo,
        start: u64,
        next: u64,
    },
    Signalled {
        info: ProcInfo,
    },
    Refused {
        code: ProcErrorCode,
        message: String,
    },
}
