//! The host-side async client: one connection to one agent, many requests at once.
//! A background task reads frames and routes them to the waiting calls; when the
//! stream breaks, every call in flight fails at once with `ConnectionLost`.

mod flow;
pub mod fswatch;
mod io;
pub mod tcp;
#[cfg(test)]
mod tests;
mod waiters;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};

use crate::frame::{CHUNK_SIZE, MAX_PAYLOAD};
use crate::{
    ExecExit, ExecOutcome, ExecSignal, ExecSpec, FrameError, FsError, FsRequest, FsResponse, Hello,
    Message, MessageError, ProcReply, ProcRequest, RequestError, FEATURE_EXEC_SIGNAL,
    FEATURE_PROCESSES, PROTOCOL_VERSION,
};
pub use flow::{FlowExec, FlowExit, FlowHandle};
pub use fswatch::{WatchItem, WatchStream};
pub use tcp::{TcpEvent, TcpReader, TcpWriter};
use waiters::{ExecWaiter, FsWaiter, ProcWaiter, StreamWaiter, Waiter, Waiters};

/// Extra time past an exec's own timeout before the client stops waiting for the agent.
const EXEC_GRACE: Duration = Duration::from_secs(10);
/// How long the client waits for an fs answer: the agent's own deadline, plus the grace.
const FS_WAIT: Duration = crate::fs::FS_CALL_TIMEOUT.saturating_add(EXEC_GRACE);
/// How long the client waits for a `ProcReply` (the agent answers from memory, or once a
/// start has spawned).
const PROC_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    #[error("connection to the agent lost: {0}")]
    ConnectionLost(String),
    #[error("agent handshake failed: {0}")]
    Handshake(String),
    #[error("agent speaks protocol version {theirs}, this host speaks {ours}")]
    VersionMismatch { ours: u32, theirs: u32 },
    #[error("agent refused the request: {0}")]
    Request(RequestError),
    #[error("{0}")]
    Fs(FsError),
    #[error("agent did not answer request {id} in time")]
    Unresponsive { id: u32 },
    #[error("unexpected message from the agent: {0}")]
    Unexpected(String),
    #[error("request could not be encoded: {0}")]
    Encode(String),
    /// Refused before anything was sent: the link stays whole and the next request works.
    #[error(
        "the request is {bytes} bytes as an agent frame, over the link's limit of {limit} bytes"
    )]
    TooLarge { bytes: usize, limit: usize },
    /// The agent lacks what the call needs (an older agent); nothing was sent.
    #[error("{0}")]
    Unsupported(String),
}

/// One piece of an exec's output, as [`AgentClient::exec_streaming`] hands it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputChunk {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

type BoxWriter = Box<dyn AsyncWrite + Unpin + Send>;

struct Inner {
    writer: tokio::sync::Mutex<BoxWriter>,
    waiters: Mutex<Waiters>,
    next_id: AtomicU32,
    /// What the agent's `Hello` listed beyond the base protocol.
    features: Vec<String>,
    /// Why the connection is gone, once it is (for [`AgentClient::closed`]).
    closed: watch::Sender<Option<String>>,
}

impl Inner {
    /// Fails every request in flight, refuses new ones and tells who waits for the end.
    fn close(&self, reason: &str) {
        lock(&self.waiters).close(reason);
        self.closed.send_if_modified(|closed| {
            let first = closed.is_none();
            if first {
                *closed = Some(reason.to_string());
            }
            first
        });
    }
}

/// A connection to one agent. Cheap to clone; all clones share the connection.
#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
}

impl AgentClient {
    /// Sends our `Hello`, waits for the agent's and checks the version, then starts the
    /// reader task. Wrap it in a timeout if the agent might never answer.
    pub async fn connect<R, W>(mut reader: R, mut writer: W) -> Result<AgentClient, AgentError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let hello = Message::Hello(Hello::new(concat!(
            "agent-proto ",
            env!("CARGO_PKG_VERSION")
        )));
        let frame = hello
            .into_frame(0)
            .map_err(|e| AgentError::Encode(e.to_string()))?;
        io::write_frame(&mut writer, &frame)
            .await
            .map_err(|e| AgentError::Handshake(e.to_string()))?;
        let reply = io::read_frame(&mut reader)
            .await
            .map_err(|e| AgentError::Handshake(e.to_string()))?;
        let features = match Message::from_frame(reply) {
            Ok(Message::Hello(peer)) if peer.version == PROTOCOL_VERSION => peer.features,
            Ok(Message::Hello(peer)) => {
                return Err(AgentError::VersionMismatch {
                    ours: PROTOCOL_VERSION,
                    theirs: peer.version,
                })
            }
            Ok(other) => {
                return Err(AgentError::Handshake(format!(
                    "expected Hello, got {other:?}"
                )))
            }
            Err(e) => return Err(AgentError::Handshake(e.to_string())),
        };
        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(Box::new(writer)),
            waiters: Mutex::new(Waiters::default()),
            next_id: AtomicU32::new(1),
            features,
            closed: watch::Sender::new(None),
        });
        tokio::spawn(read_loop(reader, Arc::downgrade(&inner)));
        Ok(AgentClient { inner })
    }

    /// Runs one program in the agent. Many may run at once on one client.
    pub async fn exec(&self, spec: ExecSpec) -> Result<ExecOutcome, AgentError> {
        self.exec_signalled(spec, None).await
    }

    /// [`exec`](Self::exec), and each number received on `signals` while it runs is sent
    /// to the program's process group as a signal (see [`Self::signal_exec`]).
    pub async fn exec_signalled(
        &self,
        spec: ExecSpec,
        signals: Option<mpsc::UnboundedReceiver<i32>>,
    ) -> Result<ExecOutcome, AgentError> {
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter::Exec(ExecWaiter {
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            cap: spec.max_output_bytes,
            reply: tx,
        });
        self.run_exec(&spec, waiter, rx, signals).await
    }

    /// Runs one program in the agent like [`exec`](Self::exec), but hands its output to
    /// `sink` chunk by chunk as it arrives, stdout and stderr in the order the agent sent
    /// them, instead of collecting it: the client keeps none of it. The agent still forwards
    /// at most `spec.max_output_bytes` per stream (`usize::MAX` for everything). Once the
    /// exec ends, `sink`'s receiver sees every chunk and then its end; the answer is the
    /// agent's `ExecExit`.
    ///
    /// A full `sink` holds up the connection (the client reads no further frames until it
    /// has room), which in turn holds up the program's output in the agent: memory stays
    /// bounded by the channel's capacity. Keep receiving while the exec runs, or drop the
    /// receiver to discard the rest.
    pub async fn exec_streaming(
        &self,
        spec: ExecSpec,
        sink: mpsc::Sender<OutputChunk>,
    ) -> Result<ExecExit, AgentError> {
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter::ExecStream(StreamWaiter { sink, reply: tx });
        self.run_exec(&spec, waiter, rx, None).await
    }

    async fn run_exec<T>(
        &self,
        spec: &ExecSpec,
        waiter: Waiter,
        mut rx: oneshot::Receiver<Result<T, AgentError>>,
        mut signals: Option<mpsc::UnboundedReceiver<i32>>,
    ) -> Result<T, AgentError> {
        let id = self.next_id();
        self.register(id, waiter)?;
        let mut guard = InFlight {
            client: self,
            id,
            kill_on_drop: false,
        };
        self.send(Message::ExecStart(spec.to_request()), id).await?;
        // Started: from here on a call that ends early kills the program.
        guard.kill_on_drop = true;
        if !spec.stdin.is_empty() {
            let chunks: Vec<&[u8]> = spec.stdin.chunks(CHUNK_SIZE).collect();
            let last = chunks.len() - 1;
            for (i, chunk) in chunks.into_iter().enumerate() {
                let msg = Message::Stdin {
                    data: chunk.to_vec(),
                    end: i == last,
                };
                self.send(msg, id).await?;
            }
        }
        let deadline = (spec.timeout_ms != 0).then(|| {
            let limit = Duration::from_millis(spec.timeout_ms).saturating_add(EXEC_GRACE);
            tokio::time::Instant::now() + limit
        });
        let result = loop {
            tokio::select! {
                r = &mut rx => break flatten(r),
                () = sleep_until(deadline) => break Err(AgentError::Unresponsive { id }),
                signal = next_signal(&mut signals) => self.signal_exec(id, signal).await,
            }
        };
        // Finished (or the connection is gone): nothing left to kill.
        guard.kill_on_drop = matches!(result, Err(AgentError::Unresponsive { .. }));
        result
    }

    /// Runs one filesystem operation in the agent. The agent answers every one within
    /// [`FS_CALL_TIMEOUT`](crate::FS_CALL_TIMEOUT) (S216 past it); an agent that does not
    /// is reported as [`AgentError::Unresponsive`] a grace period later.
    pub async fn fs(&self, op: FsRequest) -> Result<FsResponse, AgentError> {
        self.fs_within(op, FS_WAIT).await
    }

    async fn fs_within(&self, op: FsRequest, wait: Duration) -> Result<FsResponse, AgentError> {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        let cap = match &op {
            FsRequest::Read { max_bytes, .. } => usize::try_from(*max_bytes).unwrap_or(usize::MAX),
            _ => 0,
        };
        self.register(
            id,
            Waiter::Fs(FsWaiter {
                data: Vec::new(),
                cap,
                reply: tx,
            }),
        )?;
        let _guard = InFlight {
            client: self,
            id,
            kill_on_drop: false,
        };
        let mut op = op;
        // The body travels as Data frames: take it out rather than copy it.
        let body = match &mut op {
            FsRequest::Write { data, .. } => Some(std::mem::take(data)),
            _ => None,
        };
        self.send(
            Message::FsRequest {
                request: op,
                has_body: body.is_some(),
            },
            id,
        )
        .await?;
        if let Some(body) = body {
            let mut chunks: Vec<&[u8]> = body.chunks(CHUNK_SIZE).collect();
            if chunks.is_empty() {
                chunks.push(&[]);
            }
            let last = chunks.len() - 1;
            for (i, chunk) in chunks.into_iter().enumerate() {
                let msg = Message::Data {
                    data: chunk.to_vec(),
                    end: i == last,
                };
                self.send(msg, id).await?;
            }
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(r) => flatten(r),
            // The guard forgets the request: a late answer is dropped.
            Err(_) => Err(AgentError::Unresponsive { id }),
        }
    }

    /// Sends `signal` to the process group of exec `id` (the agent follows it with SIGKILL
    /// after [`crate::process::SIGNAL_GRACE`]). An agent without `exec_signal` gets
    /// `ExecKill` instead. A failed send means the link is gone, which ends the exec anyway.
    pub(crate) async fn signal_exec(&self, id: u32, signal: i32) {
        let msg = if self.supports(FEATURE_EXEC_SIGNAL) {
            Message::ExecSignal(ExecSignal { signal })
        } else {
            Message::ExecKill
        };
        let _ = self.send(msg, id).await;
    }

    /// One background-process request (see [`crate::process`]): the agent's answer, and
    /// for `Output` the bytes that came with it (at most
    /// [`crate::process::MAX_OUTPUT_PAGE`], more is dropped here).
    pub async fn process(&self, request: ProcRequest) -> Result<(ProcReply, Vec<u8>), AgentError> {
        if !self.supports(FEATURE_PROCESSES) {
            return Err(AgentError::Unsupported(format!(
                "the agent does not support {FEATURE_PROCESSES} (it predates background processes)"
            )));
        }
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        self.register(
            id,
            Waiter::Proc(ProcWaiter {
                data: Vec::new(),
                reply: tx,
            }),
        )?;
        let _guard = InFlight {
            client: self,
            id,
            kill_on_drop: false,
        };
        self.send(Message::ProcRequest(request), id).await?;
        match tokio::time::timeout(PROC_WAIT, rx).await {
            Ok(r) => flatten(r),
            Err(_) => Err(AgentError::Unresponsive { id }),
        }
    }

    /// Asks the agent to kill everything it started and exit. Succeeds once the agent
    /// acknowledges or the stream closes.
    pub async fn shutdown(&self) -> Result<(), AgentError> {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        if self.register(id, Waiter::Shutdown(tx)).is_err() {
            return Ok(()); // already gone
        }
        match self.send(Message::Shutdown, id).await {
            Ok(()) | Err(AgentError::ConnectionLost(_)) => {}
            Err(e) => return Err(e),
        }
        match flatten(rx.await) {
            Ok(()) | Err(AgentError::ConnectionLost(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// True once the stream to the agent has broken or closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.inner.waiters).is_closed()
    }

    /// Waits until the connection is gone (the agent closed the stream, a write failed, or
    /// the agent sent what cannot be decoded) and says why.
    pub async fn closed(&self) -> String {
        let mut watch = self.inner.closed.subscribe();
        let reason = match watch.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "the connection was dropped".into(),
        };
        reason
    }

    fn next_id(&self) -> u32 {
        loop {
            let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id; // 0 is the connection's own id (Hello)
            }
        }
    }

    fn register(&self, id: u32, waiter: Waiter) -> Result<(), AgentError> {
        lock(&self.inner.waiters).register(id, waiter)
    }

    /// Sends one frame. A frame over [`MAX_PAYLOAD`] is refused here, before a byte is
    /// written: only a failed write closes the connection.
    async fn send(&self, msg: Message, id: u32) -> Result<(), AgentError> {
        let bytes = msg
            .into_frame(id)
            .and_then(|frame| Ok(frame.to_bytes()?))
            .map_err(|e| match e {
                MessageError::Frame(FrameError::TooLarge(bytes)) => AgentError::TooLarge {
                    bytes,
                    limit: MAX_PAYLOAD,
                },
                other => AgentError::Encode(other.to_string()),
            })?;
        let mut writer = self.inner.writer.lock().await;
        if let Err(e) = io::write_bytes(&mut *writer, &bytes).await {
            let reason = format!("write failed: {e}");
            self.inner.close(&reason);
            return Err(AgentError::ConnectionLost(reason));
        }
        Ok(())
    }
}

/// Forgets a request when its call ends early (cancelled future, client-side timeout),
/// and kills the exec in the agent so nothing keeps running unobserved.
struct InFlight<'a> {
    client: &'a AgentClient,
    id: u32,
    kill_on_drop: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let was_waiting = lock(&self.client.inner.waiters).remove(self.id).is_some();
        if was_waiting && self.kill_on_drop {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let client = self.client.clone();
                let id = self.id;
                handle.spawn(async move {
                    let _ = client.send(Message::ExecKill, id).await;
                });
            }
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(mut reader: R, inner: std::sync::Weak<Inner>) {
    let reason = loop {
        let frame = match io::read_frame(&mut reader).await {
            Ok(frame) => frame,
            Err(FrameError::Closed) => break "agent closed the stream".to_string(),
            Err(e @ FrameError::Io(_)) => break e.to_string(),
            Err(e) => break format!("the agent sent a frame the host cannot decode ({e})"),
        };
        let Some(inner) = inner.upgrade() else {
            return; // every client handle is gone
        };
        let id = frame.id;
        match Message::from_frame(frame) {
            Ok(msg) => {
                let pending = lock(&inner.waiters).deliver(id, msg);
                drop(inner);
                if let Some(pending) = pending {
                    // Outside the lock, so calls can still be made and sent meanwhile; but
                    // no frame is read until this sink has room.
                    pending.deliver().await;
                }
            }
            Err(e @ MessageError::BadPayload { .. })
            | Err(e @ MessageError::UnexpectedPayload(_)) => {
                break format!("malformed message from the agent: {e}")
            }
            Err(e) => break e.to_string(),
        }
    };
    if let Some(inner) = inner.upgrade() {
        inner.close(&reason);
    }
}

/// Sleeps until `deadline`; for ever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The next signal asked for; pends for ever once there is no sender (or none was given).
async fn next_signal(signals: &mut Option<mpsc::UnboundedReceiver<i32>>) -> i32 {
    if let Some(rx) = signals.as_mut() {
        if let Some(signal) = rx.recv().await {
            return signal;
        }
        *signals = None;
    }
    std::future::pending().await
}

fn flatten<T>(
    r: Result<Result<T, AgentError>, oneshot::error::RecvError>,
) -> Result<T, AgentError> {
    r.unwrap_or_else(|_| Err(AgentError::ConnectionLost("reply dropped".into())))
}

/// The waiters map stays consistent even if a holder panicked, so poisoning is ignored.
fn lock(m: &Mutex<Waiters>) -> MutexGuard<'_, Waiters> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
