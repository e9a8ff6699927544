//! Flow-controlled execs: output handed on chunk by chunk and acknowledged by the consumer,
//! stdin fed while the program runs. Per exec, so a consumer that stops reading holds up its
//! own program only, never the connection (other execs and fs calls on it go on).
//!
//! Bounds: the agent keeps at most `window` cost units of output unacknowledged (it stops
//! reading the program's pipes until `consumed` is called, so the program blocks on a full
//! pipe), and the host at most `window` of stdin the agent has not written yet. An agent
//! that sends past its window is treated as broken: the exec fails and is killed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::waiters::{FlowWaiter, Waiter};
use super::{flatten, lock, AgentClient, AgentError, OutputChunk, EXEC_GRACE};
use crate::frame::CHUNK_SIZE;
use crate::{
    flow_cost, ExecExit, ExecSpec, FlowAck, Message, TtySize, FEATURE_EXEC_FLOW, FEATURE_EXEC_TTY,
};

/// What one flow-controlled exec shares between the read loop and its handles.
pub(crate) struct FlowState {
    window: u64,
    /// Output cost handed to the sink and not yet acknowledged by the consumer.
    output_unacked: AtomicU64,
    /// Stdin the host may still send, in cost units.
    stdin_credit: Semaphore,
    /// Stdin cost sent and not yet acknowledged (an ack never returns more than this).
    stdin_unacked: AtomicU64,
    done: AtomicBool,
}

impl FlowState {
    pub(crate) fn new(window: u64) -> FlowState {
        FlowState {
            window,
            output_unacked: AtomicU64::new(0),
            stdin_credit: Semaphore::new(window as usize),
            stdin_unacked: AtomicU64::new(0),
            done: AtomicBool::new(false),
        }
    }

    /// Counts a chunk handed to the sink; false if it takes the agent past its window.
    pub(crate) fn take_output(&self, len: usize) -> bool {
        let cost = flow_cost(len);
        let before = self.output_unacked.fetch_add(cost, Ordering::SeqCst);
        before.saturating_add(cost) <= self.window
    }

    /// Returns stdin credit the agent acknowledged, never more than was sent.
    pub(crate) fn stdin_written(&self, bytes: u64) {
        let mut returned = 0;
        let _ = self
            .stdin_unacked
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |unacked| {
                returned = bytes.min(unacked);
                Some(unacked - returned)
            });
        self.stdin_credit.add_permits(returned as usize);
    }

    /// A chunk of `len` bytes handed on by the consumer: its cost, taken off what is
    /// unacknowledged (to be sent back to the agent as an ack).
    pub(crate) fn output_consumed(&self, len: usize) -> u64 {
        let cost = flow_cost(len);
        let _ = self
            .output_unacked
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(cost))
            });
        cost
    }

    /// Waits for credit to send a chunk of `len` bytes (at most the window's worth, which
    /// the caller ensures); false once the stream or exec is over.
    pub(crate) async fn take_input_credit(&self, len: usize) -> bool {
        let cost = flow_cost(len);
        match self.stdin_credit.acquire_many(cost as u32).await {
            Ok(permit) => permit.forget(),
            Err(_) => return false,
        }
        self.stdin_unacked.fetch_add(cost, Ordering::SeqCst);
        true
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// The exec is over: stdin waiting for credit gives up.
    pub(crate) fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.stdin_credit.close();
    }
}

/// A running flow-controlled exec, in three parts that can go to different tasks.
pub struct FlowExec {
    /// The program's output in the order the agent sent it; ends after `ExecExit`.
    /// Call [`FlowHandle::consumed`] for each chunk once it has been passed on.
    pub output: mpsc::UnboundedReceiver<OutputChunk>,
    pub handle: FlowHandle,
    pub exit: FlowExit,
}

/// Acknowledges output, feeds stdin, kills. Cheap to clone.
#[derive(Clone)]
pub struct FlowHandle {
    client: AgentClient,
    id: u32,
    state: Arc<FlowState>,
}

/// The end of the exec. Dropping it before the end kills the program.
pub struct FlowExit {
    client: AgentClient,
    id: u32,
    rx: oneshot::Receiver<Result<ExecExit, AgentError>>,
    timeout_ms: u64,
    finished: bool,
}

impl AgentClient {
    /// Whether the agent listed `feature` in its `Hello`.
    pub fn supports(&self, feature: &str) -> bool {
        self.inner.features.iter().any(|f| f == feature)
    }

    /// Starts `spec` (its `stdin` bytes unused) with a flow window of `window` cost units
    /// (at least one full chunk's worth), stdin left open for [`FlowHandle::stdin`] when
    /// `stdin_open`. The agent still forwards at most `spec.max_output_bytes` per stream.
    pub async fn exec_flow(
        &self,
        spec: &ExecSpec,
        stdin_open: bool,
        window: u64,
    ) -> Result<FlowExec, AgentError> {
        if !self.supports(FEATURE_EXEC_FLOW) {
            return Err(AgentError::Unsupported(format!(
                "the agent does not support {FEATURE_EXEC_FLOW} (it predates streamed exec)"
            )));
        }
        if spec.tty.is_some() && !self.supports(FEATURE_EXEC_TTY) {
            return Err(AgentError::Unsupported(format!(
                "the agent does not support {FEATURE_EXEC_TTY} (it predates terminals)"
            )));
        }
        let window = window.clamp(flow_cost(4 * CHUNK_SIZE), u64::from(u32::MAX));
        let id = self.next_id();
        let (reply, rx) = oneshot::channel();
        let (sink, output) = mpsc::unbounded_channel();
        let state = Arc::new(FlowState::new(window));
        self.register(
            id,
            Waiter::ExecFlow(FlowWaiter {
                sink,
                state: state.clone(),
                reply,
            }),
        )?;
        // From here on, dropping `exit` forgets the request and kills the program.
        let exit = FlowExit {
            client: self.clone(),
            id,
            rx,
            timeout_ms: spec.timeout_ms,
            finished: false,
        };
        let mut request = spec.to_request();
        request.stdin = stdin_open;
        request.flow_window = Some(window);
        self.send(Message::ExecStart(request), id).await?;
        Ok(FlowExec {
            output,
            handle: FlowHandle {
                client: self.clone(),
                id,
                state,
            },
            exit,
        })
    }
}

impl FlowHandle {
    /// One output chunk of `len` bytes has been passed on: the agent may send that much more.
    pub async fn consumed(&self, len: usize) -> Result<(), AgentError> {
        let cost = flow_cost(len);
        let _ = self
            .state
            .output_unacked
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(cost))
            });
        if self.state.done.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.client
            .send(Message::OutputAck(FlowAck { bytes: cost }), self.id)
            .await
    }

    /// Sends `data` to the program's stdin, waiting for credit while the agent has a
    /// window's worth not yet written. `Ok(false)`: the exec has ended, stdin is moot.
    pub async fn stdin(&self, data: &[u8]) -> Result<bool, AgentError> {
        for chunk in data.chunks(CHUNK_SIZE) {
            let cost = flow_cost(chunk.len());
            // cost <= the window (clamped at start), so this can always be granted.
            match self.state.stdin_credit.acquire_many(cost as u32).await {
                Ok(permit) => permit.forget(),
                Err(_) => return Ok(false),
            }
            self.state.stdin_unacked.fetch_add(cost, Ordering::SeqCst);
            let msg = Message::Stdin {
                data: chunk.to_vec(),
                end: false,
            };
            self.client.send(msg, self.id).await?;
        }
        Ok(!self.state.done.load(Ordering::SeqCst))
    }

    /// Closes the program's stdin (its next read sees end of file).
    pub async fn close_stdin(&self) -> Result<(), AgentError> {
        let msg = Message::Stdin {
            data: Vec::new(),
            end: true,
        };
        self.client.send(msg, self.id).await
    }

    /// Sets the size of the exec's terminal (one started with `tty`); the program's
    /// foreground group gets SIGWINCH. Moot once the exec has ended, and ignored by the
    /// agent for an exec without a terminal.
    pub async fn resize(&self, size: TtySize) -> Result<(), AgentError> {
        if self.state.done.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.client.send(Message::Resize(size), self.id).await
    }

    /// Kills the program's process group; its `ExecExit` still comes (`killed: true`).
    pub async fn kill(&self) {
        let _ = self.client.send(Message::ExecKill, self.id).await;
    }

    /// Sends `signal` to the program's process group (SIGKILL follows after the grace, see
    /// [`crate::process::SIGNAL_GRACE`]); an agent without `exec_signal` kills it at once.
    pub async fn signal(&self, signal: i32) {
        self.client.signal_exec(self.id, signal).await;
    }
}

impl FlowExit {
    /// Waits for `ExecExit`: the program ended and its output was all handed to `output`.
    pub async fn wait(mut self) -> Result<ExecExit, AgentError> {
        let result = if self.timeout_ms == 0 {
            flatten((&mut self.rx).await)
        } else {
            let limit = Duration::from_millis(self.timeout_ms).saturating_add(EXEC_GRACE);
            match tokio::time::timeout(limit, &mut self.rx).await {
                Ok(r) => flatten(r),
                Err(_) => Err(AgentError::Unresponsive { id: self.id }),
            }
        };
        // An unresponsive agent or one past its window may still run the program: the drop
        // kills it.
        self.finished = !matches!(
            result,
            Err(AgentError::Unresponsive { .. }) | Err(AgentError::Unexpected(_))
        );
        result
    }
}

impl Drop for FlowExit {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Some(Waiter::ExecFlow(w)) = lock(&self.client.inner.waiters).remove(self.id) {
            w.state.finish();
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let id = self.id;
            handle.spawn(async move {
                let _ = client.send(Message::ExecKill, id).await;
            });
        }
    }
}
