//! TCP streams to a server inside the sandbox: the host asks the agent to connect to a port
//! of the guest's loopback, then bytes flow both ways in frames on the agent link, each
//! direction under a flow window so a busy stream can neither fill the other side's memory
//! nor hold the link from execs and fs calls for longer than one chunk.
//!
//! Wire: `TcpConnect` (host to agent) is answered by `TcpConnected` or `Error`
//! ([`crate::ErrorCode::ConnectFailed`], [`crate::ErrorCode::Busy`]). Then `TcpData` both
//! ways (raw; an empty one flagged end says that side will send no more, a half-close),
//! `TcpAck` both ways (a [`crate::FlowAck`] in [`crate::flow_cost`] units: the receiver
//! passed that much on), and `TcpClose` either way: the stream is over (after both ends, or
//! aborted). The agent sends `TcpClose` exactly once per stream it accepted; after it, no
//! frame of that id follows. Only to an agent whose `Hello` lists [`FEATURE_TCP_STREAM`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `Hello` feature of an agent that knows the `Tcp*` frames. Hosts never send them to an
/// agent without it (an older agent would end the link at an unknown frame kind).
pub const FEATURE_TCP_STREAM: &str = "tcp_stream";

/// Streams one agent keeps open at once; one more is refused with `Busy`. Each costs the
/// agent two threads, which count against the sandbox's process limit: the host keeps
/// fewer open (sandbox-core's `MAX_SANDBOX_CONNECTIONS`), this bounds a host that does not.
pub const MAX_TCP_STREAMS: usize = 256;

/// How long the agent tries one connect inside the guest.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Payload of `TcpConnect`, host to agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpConnect {
    /// A port of the guest's loopback: 127.0.0.1 first, ::1 if that refuses.
    pub port: u16,
    /// Flow window of each direction, in cost units: neither side sends more than this
    /// unacknowledged by the other.
    pub window: u64,
}
