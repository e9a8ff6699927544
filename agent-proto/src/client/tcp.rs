//! TCP streams to a guest port, host side (see [`crate::tcp`] for the wire). A stream is two
//! halves that can go to different tasks: [`TcpReader`] (the guest server's bytes, each
//! acknowledged once passed on) and [`TcpWriter`] (bytes to the server, sent within the
//! agent's window). Dropping both halves before the agent has closed the stream closes it.
//!
//! Bounds: the client holds at most the window of the guest's bytes per stream (an agent
//! that sends more, or sends before it connected, loses the stream), and sends at most the
//! window the agent has not yet written to the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::flow::FlowState;
use super::waiters::{TcpWaiter, Waiter};
use super::{flatten, lock, AgentClient, AgentError};
use crate::frame::CHUNK_SIZE;
use crate::{flow_cost, FlowAck, Message, TcpConnect, FEATURE_TCP_STREAM};

/// How long the host waits for the agent's answer to a `TcpConnect`: the agent's own limit
/// on its connects (two, IPv4 then IPv6), plus a grace.
const OPEN_WAIT: Duration = crate::tcp::CONNECT_TIMEOUT
    .saturating_mul(2)
    .saturating_add(Duration::from_secs(5));

/// What the guest's side of a stream sent, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcpEvent {
    Data(Vec<u8>),
    /// The server will send no more (it shut its side down); the stream may still carry
    /// bytes to it.
    End,
}

/// What both halves share; its drop closes the stream unless the agent has.
struct Shared {
    client: AgentClient,
    id: u32,
    state: Arc<FlowState>,
    agent_closed: Arc<AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        lock(&self.client.inner.waiters).remove(self.id);
        self.state.finish();
        // Closed by the agent: nothing to say. Otherwise (ours to end, or ended here because
        // the agent broke the stream's rules) the agent is told; it ignores an id it lacks.
        if self.agent_closed.load(Ordering::SeqCst) || self.client.is_closed() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let id = self.id;
            handle.spawn(async move {
                let _ = client.send(Message::TcpClose, id).await;
            });
        }
    }
}

/// The guest server's bytes.
pub struct TcpReader {
    events: mpsc::UnboundedReceiver<TcpEvent>,
    shared: Arc<Shared>,
}

/// Bytes to the guest server.
pub struct TcpWriter {
    shared: Arc<Shared>,
}

impl AgentClient {
    /// Connects to `port` on the guest's loopback through the agent, with a flow window of
    /// `window` cost units each way (at least two full chunks' worth). `Request` errors carry
    /// the agent's refusal (`ConnectFailed`: nothing listens; `Busy`: too many streams).
    pub async fn tcp_connect(
        &self,
        port: u16,
        window: u64,
    ) -> Result<(TcpReader, TcpWriter), AgentError> {
        if !self.supports(FEATURE_TCP_STREAM) {
            return Err(AgentError::Unsupported(format!(
                "the agent does not support {FEATURE_TCP_STREAM} (it predates exposed ports)"
            )));
        }
        let window = window.clamp(2 * flow_cost(CHUNK_SIZE), u64::from(u32::MAX));
        let id = self.next_id();
        let (opened, rx) = oneshot::channel();
        let (sink, events) = mpsc::unbounded_channel();
        let state = Arc::new(FlowState::new(window));
        let agent_closed = Arc::new(AtomicBool::new(false));
        self.register(
            id,
            Waiter::Tcp(TcpWaiter {
                opened: Some(opened),
                sink,
                state: state.clone(),
                agent_closed: agent_closed.clone(),
            }),
        )?;
        // From here on, dropping `shared` forgets the stream and closes it in the agent.
        let shared = Arc::new(Shared {
            client: self.clone(),
            id,
            state,
            agent_closed,
        });
        self.send(Message::TcpConnect(TcpConnect { port, window }), id)
            .await?;
        match tokio::time::timeout(OPEN_WAIT, rx).await {
            Ok(r) => flatten(r)?,
            Err(_) => return Err(AgentError::Unresponsive { id }),
        }
        Ok((
            TcpReader {
                events,
                shared: shared.clone(),
            },
            TcpWriter { shared },
        ))
    }
}

impl TcpReader {
    /// The next piece of what the server sent; `None` once the stream is over (closed by
    /// the agent, failed, or the link gone). Call [`consumed`](Self::consumed) for each
    /// `Data` once it has been passed on, or the agent stops sending.
    pub async fn recv(&mut self) -> Option<TcpEvent> {
        self.events.recv().await
    }

    /// `len` bytes of the server's have been passed on: the agent may send that much more.
    pub async fn consumed(&self, len: usize) -> Result<(), AgentError> {
        let cost = self.shared.state.output_consumed(len);
        if self.shared.state.is_done() {
            return Ok(());
        }
        let ack = Message::TcpAck(FlowAck { bytes: cost });
        self.shared.client.send(ack, self.shared.id).await
    }
}

impl TcpWriter {
    /// Sends `data` to the server, waiting for credit while the agent has a window's worth
    /// not yet written. `Ok(false)`: the stream is over, the bytes are moot.
    pub async fn send(&self, data: &[u8]) -> Result<bool, AgentError> {
        for chunk in data.chunks(CHUNK_SIZE) {
            if !self.shared.state.take_input_credit(chunk.len()).await {
                return Ok(false);
            }
            let msg = Message::TcpData {
                data: chunk.to_vec(),
                end: false,
            };
            self.shared.client.send(msg, self.shared.id).await?;
        }
        Ok(!self.shared.state.is_done())
    }

    /// No more bytes to the server: its next read sees end of file.
    pub async fn finish(&self) -> Result<(), AgentError> {
        if self.shared.state.is_done() {
            return Ok(());
        }
        let msg = Message::TcpData {
            data: Vec::new(),
            end: true,
        };
        self.shared.client.send(msg, self.shared.id).await
    }
}
