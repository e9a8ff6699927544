//! agent-proto: the wire protocol between the sandbox host (sandbox-core) and the guest
//! agent (sandbox-agent), over one byte stream, framed and multiplexed by request id.
//!
//! Layout: [`frame`] (12-byte header, the single maximum-size check), [`message`] (the
//! typed view of every frame), one module per domain ([`exec`], [`fs`]), the handshake
//! ([`hello`]), and behind the `client` feature the host-side async [`AgentClient`].
//! It is not the agent (see the `sandbox-agent` crate) and knows nothing about S-codes
//! beyond the fs codes S210..S219 the agent produces itself.
//!
//! Wire summary: each side sends `Hello` first (id 0); requests use ids chosen by the
//! host (non-zero); an exec is `ExecStart` [+ `Stdin`...] and is answered by
//! `Stdout`/`Stderr` chunks then exactly one `ExecExit` (or `Error`); an fs op is
//! `FsRequest` [+ `Data`...] answered by [`Data`...] then `FsResponse` (or `Error`).
//! An exec with a flow window (agents whose `Hello` lists `exec_flow`) also has
//! `OutputAck` host to agent and `StdinAck` agent to host (see [`ExecRequest::flow_window`]).
//! An exec on a terminal (agents whose `Hello` lists `exec_tty`) may get `Resize` frames
//! host to agent (see [`ExecRequest::tty`]). Agents whose `Hello` lists `tcp_stream` relay
//! TCP streams to the guest's loopback (`TcpConnect`, `TcpData`, ..., see [`tcp`]); agents whose
//! `Hello` lists `fs_watch` watch paths (`WatchStart`, `WatchEvents`, ..., see [`watch`]).
//! Agents whose `Hello` lists `exec_signal` take `ExecSignal` on a running exec, and those
//! listing `processes` keep background processes (`ProcRequest`, `ProcReply`, see
//! [`process`]).

pub mod error;
pub mod exec;
pub mod frame;
pub mod fs;
pub mod hello;
pub mod message;
pub mod process;
pub mod tcp;
pub mod watch;

#[cfg(feature = "client")]
pub mod client;

#[cfg(feature = "client")]
pub use client::{AgentClient, AgentError};
pub use error::{ErrorCode, RequestError};
pub use exec::{
    flow_cost, ExecExit, ExecOutcome, ExecRequest, ExecSpec, FlowAck, TtySize, FEATURE_EXEC_FLOW,
    FEATURE_EXEC_TTY, FLOW_CHUNK_OVERHEAD,
};
pub use frame::{Frame, FrameError, FrameHeader, Kind, CHUNK_SIZE, HEADER_LEN, MAX_PAYLOAD};
pub use fs::{FsEntry, FsError, FsErrorCode, FsReply, FsRequest, FsResponse, FS_CALL_TIMEOUT};
pub use hello::{Hello, PROTOCOL_VERSION};
pub use message::{Message, MessageError};
pub use process::{
    ExecSignal, ProcErrorCode, ProcInfo, ProcReply, ProcRequest, FEATURE_EXEC_SIGNAL,
    FEATURE_PROCESSES,
};
pub use tcp::{TcpConnect, FEATURE_TCP_STREAM, MAX_TCP_STREAMS};
pub use watch::{
    WatchBatch, WatchEnd, WatchEvent, WatchKind, WatchRequest, FEATURE_FS_WATCH, MAX_WATCHES,
    MAX_WATCH_DIRS,
};
