//! File watches, host side (see [`crate::watch`] for the wire). [`AgentClient::watch`] starts
//! one and hands back a [`WatchStream`] of the agent's batches; dropping the stream before the
//! agent has ended the watch stops it there.
//!
//! Bounds: the client holds at most [`WATCH_WINDOW`] batches not yet acknowledged with
//! [`WatchStream::passed_on`] (each within one frame, at most [`MAX_BATCH_EVENTS`] events);
//! an agent that sends more loses the watch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::waiters::Waiter;
use super::{flatten, lock, AgentClient, AgentError};
use crate::watch::{MAX_BATCH_EVENTS, WATCH_WINDOW};
use crate::{FlowAck, Message, WatchBatch, WatchEnd, WatchRequest, FEATURE_FS_WATCH};

/// How long the agent may take to put a watch in place (a walk of up to
/// [`crate::MAX_WATCH_DIRS`] directories) before the host gives up.
const START_WAIT: Duration = Duration::from_secs(30);

/// What the agent sent for a watch after it started, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    Batch(WatchBatch),
    /// Always last: the agent ended the watch (with the error that ended it, if one did).
    End(WatchEnd),
}

/// What the read loop keeps of a watch.
pub(crate) struct WatchWaiter {
    /// Answered at the first batch (the watch is in place) or the agent's refusal.
    started: Option<oneshot::Sender<Result<u32, AgentError>>>,
    sink: mpsc::UnboundedSender<WatchItem>,
    shared: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Batches handed to the sink and not yet acknowledged.
    unacked: AtomicU64,
    /// Set at the agent's `WatchEnd` (or a failure): nothing to stop there.
    over: AtomicBool,
}

impl WatchWaiter {
    /// One batch from the agent. Err: it broke the watch's rules (the watch ends).
    pub(crate) fn batch(&mut self, batch: WatchBatch) -> Result<(), String> {
        if batch.events.len() > MAX_BATCH_EVENTS {
            return Err(format!(
                "the agent sent a batch of {} events, over {MAX_BATCH_EVENTS}",
                batch.events.len()
            ));
        }
        if let Some(started) = self.started.take() {
            if !batch.events.is_empty() {
                return Err("the agent's first watch batch was not empty".into());
            }
            drop(started.send(Ok(batch.watched)));
            return Ok(());
        }
        let before = self.shared.unacked.fetch_add(1, Ordering::SeqCst);
        if before >= WATCH_WINDOW {
            return Err("the agent sent watch batches past its window".into());
        }
        // A closed sink means the stream's holder is gone; its drop stops the watch.
        let _ = self.sink.send(WatchItem::Batch(batch));
        Ok(())
    }

    /// The agent's last word for the watch.
    pub(crate) fn end(self, end: WatchEnd) {
        self.shared.over.store(true, Ordering::SeqCst);
        match (self.started, end.error) {
            (Some(started), Some(error)) => drop(started.send(Err(AgentError::Fs(error)))),
            (Some(started), None) => drop(started.send(Err(AgentError::Unexpected(
                "the agent ended a watch before it started".into(),
            )))),
            (None, error) => drop(self.sink.send(WatchItem::End(WatchEnd { error }))),
        }
    }

    pub(crate) fn fail(self, err: AgentError) {
        self.shared.over.store(true, Ordering::SeqCst);
        if let Some(started) = self.started {
            drop(started.send(Err(err)));
        }
        // Dropping the sink ends the stream for its reader.
    }
}

/// The batches of one watch.
pub struct WatchStream {
    items: mpsc::UnboundedReceiver<WatchItem>,
    client: AgentClient,
    id: u32,
    shared: Arc<Counts>,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        lock(&self.client.inner.waiters).remove(self.id);
        if self.shared.over.load(Ordering::SeqCst) || self.client.is_closed() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let id = self.id;
            handle.spawn(async move {
                let _ = client.send(Message::WatchStop, id).await;
            });
        }
    }
}

impl WatchStream {
    /// The next batch, or the end; `None` once the link to the agent is gone (or the agent
    /// broke the watch's rules) without an end.
    pub async fn recv(&mut self) -> Option<WatchItem> {
        self.items.recv().await
    }

    /// One batch has been passed on: the agent may send one more.
    pub async fn passed_on(&self) -> Result<(), AgentError> {
        let _ = self
            .shared
            .unacked
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(1))
            });
        if self.shared.over.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.client
            .send(Message::WatchAck(FlowAck { bytes: 1 }), self.id)
            .await
    }

    /// Asks the agent to end the watch; its `WatchEnd` follows.
    pub async fn stop(&self) -> Result<(), AgentError> {
        if self.shared.over.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.client.send(Message::WatchStop, self.id).await
    }
}

impl AgentClient {
    /// Starts watching `request.path` in the guest. Answers once the watch is in place, with
    /// the number of directories (or the one file) watched; `Fs` errors carry the agent's
    /// verdict on the path, `Request` ones its refusal (`Busy`: too many watches).
    pub async fn watch(&self, request: WatchRequest) -> Result<(WatchStream, u32), AgentError> {
        if !self.supports(FEATURE_FS_WATCH) {
            return Err(AgentError::Unsupported(format!(
                "the agent does not support {FEATURE_FS_WATCH} (it predates fs::watch)"
            )));
        }
        let id = self.next_id();
        let (started, rx) = oneshot::channel();
        let (sink, items) = mpsc::unbounded_channel();
        let shared = Arc::new(Counts::default());
        self.register(
            id,
            Waiter::Watch(WatchWaiter {
                started: Some(started),
                sink,
                shared: shared.clone(),
            }),
        )?;
        // From here on, dropping `stream` forgets the watch and stops it in the agent.
        let stream = WatchStream {
            items,
            client: self.clone(),
            id,
            shared,
        };
        self.send(Message::WatchStart(request), id).await?;
        let watched = match tokio::time::timeout(START_WAIT, rx).await {
            Ok(r) => flatten(r)?,
            Err(_) => return Err(AgentError::Unresponsive { id }),
        };
        Ok((stream, watched))
    }
}
