//! What the client remembers per request in flight, and how incoming frames fill it.
//! Output is capped here too, so the client never holds more than the caller allowed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::client::flow::FlowState;
use crate::client::fswatch::WatchWaiter;
use crate::client::tcp::TcpEvent;
use crate::client::{AgentError, OutputChunk};
use crate::process::MAX_OUTPUT_PAGE;
use crate::{ExecExit, ExecOutcome, FsReply, FsResponse, Message, ProcReply};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, AgentError>>;

pub(crate) struct ExecWaiter {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub cap: usize,
    pub reply: Reply<ExecOutcome>,
}

/// An exec whose output goes to the caller's sink as it arrives (nothing kept here).
pub(crate) struct StreamWaiter {
    pub sink: mpsc::Sender<OutputChunk>,
    pub reply: Reply<ExecExit>,
}

/// A flow-controlled exec (see `client::flow`): output to an unbounded sink, bounded by
/// the agent's window, which is checked here.
pub(crate) struct FlowWaiter {
    pub sink: mpsc::UnboundedSender<OutputChunk>,
    pub state: Arc<FlowState>,
    pub reply: Reply<ExecExit>,
}

pub(crate) struct FsWaiter {
    pub data: Vec<u8>,
    pub cap: usize,
    pub reply: Reply<FsResponse>,
}

/// A TCP stream to a guest port (see `client::tcp`): the agent's bytes to an unbounded sink,
/// bounded by the window, which is checked here.
pub(crate) struct TcpWaiter {
    /// Answered at `TcpConnected` (or with the agent's refusal).
    pub opened: Option<Reply<()>>,
    pub sink: mpsc::UnboundedSender<TcpEvent>,
    pub state: Arc<FlowState>,
    /// Set at the agent's `TcpClose`: the stream is gone there, nothing to close.
    pub agent_closed: Arc<AtomicBool>,
}

/// A background-process request: the `Data` bytes of an `Output`, then the `ProcReply`.
pub(crate) struct ProcWaiter {
    pub data: Vec<u8>,
    pub reply: Reply<(ProcReply, Vec<u8>)>,
}

pub(crate) enum Waiter {
    Proc(ProcWaiter),
    Tcp(TcpWaiter),
    Exec(ExecWaiter),
    ExecStream(StreamWaiter),
    ExecFlow(FlowWaiter),
    Fs(FsWaiter),
    Shutdown(Reply<()>),
    Watch(WatchWaiter),
}

/// A chunk for a sink that had no room when it arrived: the read loop waits for room
/// (outside the lock) before it reads the next frame.
pub(crate) struct Pending {
    pub sink: mpsc::Sender<OutputChunk>,
    pub chunk: OutputChunk,
}

impl Pending {
    pub async fn deliver(self) {
        // A closed sink means the caller stopped listening; the chunk is dropped.
        let _ = self.sink.send(self.chunk).await;
    }
}

impl Waiter {
    fn fail(self, err: AgentError) {
        // A dropped receiver means the caller gave up; nothing to tell it.
        match self {
            Waiter::Exec(w) => drop(w.reply.send(Err(err))),
            Waiter::ExecStream(w) => drop(w.reply.send(Err(err))),
            Waiter::ExecFlow(w) => {
                w.state.finish();
                drop(w.reply.send(Err(err)));
            }
            Waiter::Fs(w) => drop(w.reply.send(Err(err))),
            Waiter::Proc(w) => drop(w.reply.send(Err(err))),
            Waiter::Shutdown(tx) => drop(tx.send(Err(err))),
            Waiter::Watch(w) => w.fail(err),
            // Dropping the sink ends the stream for its reader.
            Waiter::Tcp(w) => {
                w.state.finish();
                if let Some(opened) = w.opened {
                    drop(opened.send(Err(err)));
                }
            }
        }
    }
}

/// Requests in flight, and whether the connection is gone (checked under the same lock
/// so a request registered after the failure is refused, not forgotten).
#[derive(Default)]
pub(crate) struct Waiters {
    map: HashMap<u32, Waiter>,
    closed: Option<String>,
}

impl Waiters {
    pub fn register(&mut self, id: u32, waiter: Waiter) -> Result<(), AgentError> {
        if let Some(reason) = &self.closed {
            let err = AgentError::ConnectionLost(reason.clone());
            waiter.fail(err.clone());
            return Err(err);
        }
        self.map.insert(id, waiter);
        Ok(())
    }

    pub fn remove(&mut self, id: u32) -> Option<Waiter> {
        self.map.remove(&id)
    }

    /// Fails every request in flight and refuses new ones.
    pub fn close(&mut self, reason: &str) {
        if self.closed.is_none() {
            self.closed = Some(reason.to_string());
        }
        for (_, waiter) in self.map.drain() {
            waiter.fail(AgentError::ConnectionLost(reason.to_string()));
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Routes one message from the agent to its request. Messages for ids no longer
    /// waited for (a caller that gave up) are dropped. An output chunk for a full sink comes
    /// back, for the caller to wait for room without holding the lock.
    pub fn deliver(&mut self, id: u32, msg: Message) -> Option<Pending> {
        let waiter = self.map.get_mut(&id)?;
        match (waiter, msg) {
            (Waiter::Exec(w), Message::Stdout(data)) => {
                append_capped(&mut w.stdout, &data, w.cap, &mut w.stdout_truncated)
            }
            (Waiter::Exec(w), Message::Stderr(data)) => {
                append_capped(&mut w.stderr, &data, w.cap, &mut w.stderr_truncated)
            }
            (Waiter::Exec(_), Message::ExecExit(exit)) => {
                if let Some(Waiter::Exec(w)) = self.map.remove(&id) {
                    let outcome = finish_exec(
                        w.stdout,
                        w.stderr,
                        w.stdout_truncated,
                        w.stderr_truncated,
                        &exit,
                    );
                    drop(w.reply.send(Ok(outcome)));
                }
            }
            (Waiter::ExecStream(w), Message::Stdout(data)) => {
                return offer(&w.sink, OutputChunk::Stdout(data))
            }
            (Waiter::ExecStream(w), Message::Stderr(data)) => {
                return offer(&w.sink, OutputChunk::Stderr(data))
            }
            (Waiter::ExecStream(_), Message::ExecExit(exit)) => {
                // Dropping the waiter drops its sink: the caller's receiver ends after the
                // last chunk.
                if let Some(Waiter::ExecStream(w)) = self.map.remove(&id) {
                    drop(w.reply.send(Ok(exit)));
                }
            }
            (Waiter::ExecFlow(_), Message::Stdout(data)) => {
                self.flow_output(id, OutputChunk::Stdout(data))
            }
            (Waiter::ExecFlow(_), Message::Stderr(data)) => {
                self.flow_output(id, OutputChunk::Stderr(data))
            }
            (Waiter::ExecFlow(w), Message::StdinAck(ack)) => w.state.stdin_written(ack.bytes),
            (Waiter::ExecFlow(_), Message::ExecExit(exit)) => {
                // Dropping the waiter drops its sink: the output ends after the last chunk.
                if let Some(Waiter::ExecFlow(w)) = self.map.remove(&id) {
                    w.state.finish();
                    drop(w.reply.send(Ok(exit)));
                }
            }
            (Waiter::Fs(w), Message::Data { data, .. }) => {
                let mut over = false;
                append_capped(&mut w.data, &data, w.cap, &mut over);
            }
            (Waiter::Fs(_), Message::FsReply(reply)) => {
                if let Some(Waiter::Fs(w)) = self.map.remove(&id) {
                    let result = match reply {
                        FsReply::Ok(FsResponse::Read {
                            size, mode, mtime, ..
                        }) => Ok(FsResponse::Read {
                            size,
                            mode,
                            mtime,
                            data: w.data,
                        }),
                        FsReply::Ok(other) => Ok(other),
                        FsReply::Err(e) => Err(AgentError::Fs(e)),
                    };
                    drop(w.reply.send(result));
                }
            }
            (Waiter::Proc(w), Message::Data { data, .. }) => {
                let mut over = false;
                append_capped(&mut w.data, &data, MAX_OUTPUT_PAGE as usize, &mut over);
            }
            (Waiter::Proc(_), Message::ProcReply(reply)) => {
                if let Some(Waiter::Proc(w)) = self.map.remove(&id) {
                    drop(w.reply.send(Ok((reply, w.data))));
                }
            }
            (Waiter::Tcp(w), Message::TcpConnected) => {
                if let Some(opened) = w.opened.take() {
                    drop(opened.send(Ok(())));
                }
            }
            (Waiter::Tcp(_), Message::TcpData { data, end }) => self.tcp_data(id, data, end),
            (Waiter::Tcp(w), Message::TcpAck(ack)) => w.state.stdin_written(ack.bytes),
            (Waiter::Tcp(_), Message::TcpClose) => {
                // The agent is done with the stream; the sink's end tells the reader.
                if let Some(Waiter::Tcp(w)) = self.map.remove(&id) {
                    w.agent_closed.store(true, Ordering::SeqCst);
                    w.state.finish();
                }
            }
            (Waiter::Watch(w), Message::WatchEvents(batch)) => {
                if let Err(why) = w.batch(batch) {
                    if let Some(w) = self.map.remove(&id) {
                        w.fail(AgentError::Unexpected(why));
                    }
                }
            }
            (Waiter::Watch(_), Message::WatchEnd(end)) => {
                if let Some(Waiter::Watch(w)) = self.map.remove(&id) {
                    w.end(end);
                }
            }
            (Waiter::Shutdown(_), Message::ShutdownAck) => {
                if let Some(Waiter::Shutdown(tx)) = self.map.remove(&id) {
                    drop(tx.send(Ok(())));
                }
            }
            (_, Message::Error(e)) => {
                if let Some(w) = self.map.remove(&id) {
                    w.fail(AgentError::Request(e));
                }
            }
            (_, other) => {
                if let Some(w) = self.map.remove(&id) {
                    w.fail(AgentError::Unexpected(
                        format!("{other:?}").chars().take(200).collect(),
                    ));
                }
            }
        }
        None
    }
}

impl Waiters {
    /// Hands a flow exec's chunk on, or fails the exec if the agent overran its window.
    fn flow_output(&mut self, id: u32, chunk: OutputChunk) {
        let Some(Waiter::ExecFlow(w)) = self.map.get(&id) else {
            return;
        };
        let len = match &chunk {
            OutputChunk::Stdout(d) | OutputChunk::Stderr(d) => d.len(),
        };
        if w.state.take_output(len) {
            // A closed sink means the consumer stopped listening; the chunk is dropped.
            let _ = w.sink.send(chunk);
        } else if let Some(w) = self.map.remove(&id) {
            w.fail(AgentError::Unexpected(
                "the agent sent output past its flow window".into(),
            ));
        }
    }
}

impl Waiters {
    /// Hands a stream's bytes on, or ends the stream if the agent overran its window or
    /// sent bytes before the connection was up.
    fn tcp_data(&mut self, id: u32, data: Vec<u8>, end: bool) {
        let Some(Waiter::Tcp(w)) = self.map.get(&id) else {
            return;
        };
        let fits = w.opened.is_none() && (data.is_empty() || w.state.take_output(data.len()));
        if !fits {
            if let Some(w) = self.map.remove(&id) {
                w.fail(AgentError::Unexpected(
                    "the agent sent stream bytes out of turn or past its flow window".into(),
                ));
            }
            return;
        }
        // A closed sink means the reader is gone; its drop closes the stream.
        if !data.is_empty() {
            let _ = w.sink.send(TcpEvent::Data(data));
        }
        if end {
            let _ = w.sink.send(TcpEvent::End);
        }
    }
}

/// Hands `chunk` to `sink` if it has room; otherwise it comes back to be waited for.
fn offer(sink: &mpsc::Sender<OutputChunk>, chunk: OutputChunk) -> Option<Pending> {
    match sink.try_send(chunk) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => None,
        Err(mpsc::error::TrySendError::Full(chunk)) => Some(Pending {
            sink: sink.clone(),
            chunk,
        }),
    }
}

fn append_capped(buf: &mut Vec<u8>, data: &[u8], cap: usize, truncated: &mut bool) {
    let room = cap.saturating_sub(buf.len());
    if data.len() > room {
        *truncated = true;
    }
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

fn finish_exec(
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_cut: bool,
    stderr_cut: bool,
    exit: &ExecExit,
) -> ExecOutcome {
    ExecOutcome {
        stdout,
        stderr,
        stdout_truncated: stdout_cut || exit.stdout_truncated,
        stderr_truncated: stderr_cut || exit.stderr_truncated,
        exit_code: exit.exit_code,
        timed_out: exit.timed_out,
        duration_ms: exit.duration_ms,
    }
}
