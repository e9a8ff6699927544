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
                let why = "the agent's first watch batch was not empty".to_string();
                drop(started.send(Err(AgentError::Unexpected(why.clone()))));
                return Err(why);
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
        // An agent that broke the watch's rules still runs it: the stream's drop stops it
        // there. Any other failure (a refusal, the link gone) leaves nothing to stop.
        if !matches!(err, AgentError::Unexpected(_)) {
            self.shared.over.store(true, Ordering::SeqCst);
        }
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

#[cfg(test)]
mod tests {
    use tokio::io::{duplex, split, DuplexStream, ReadHalf, WriteHalf};

    use super::super::io::{read_frame, write_frame};
    use super::*;
    use crate::{Frame, Hello, Kind, WatchEvent, WatchKind};

    /// A scripted agent over an in-memory pipe.
    struct Fake {
        reader: ReadHalf<DuplexStream>,
        writer: WriteHalf<DuplexStream>,
    }

    impl Fake {
        async fn send(&mut self, id: u32, msg: Message) {
            let frame = msg.into_frame(id).expect("encodes");
            write_frame(&mut self.writer, &frame).await.expect("write");
        }
        async fn recv(&mut self) -> Frame {
            read_frame(&mut self.reader).await.expect("frame")
        }
    }

    async fn pair() -> (AgentClient, Fake) {
        let (host_end, agent_end) = duplex(4 * 1024 * 1024);
        let (hr, hw) = split(host_end);
        let (ar, aw) = split(agent_end);
        let mut fake = Fake {
            reader: ar,
            writer: aw,
        };
        let hello = Hello::new("fake").with_features(&[FEATURE_FS_WATCH]);
        fake.send(0, Message::Hello(hello)).await;
        let client = AgentClient::connect(hr, hw).await.expect("connects");
        assert_eq!(fake.recv().await.kind, Kind::Hello);
        (client, fake)
    }

    fn request() -> WatchRequest {
        WatchRequest {
            path: "/w".into(),
            recursive: false,
            max_dirs: 1,
        }
    }

    fn batch(events: usize) -> Message {
        let event = WatchEvent {
            kind: WatchKind::Created,
            path: "a".into(),
            is_dir: false,
            from: None,
        };
        Message::WatchEvents(WatchBatch {
            events: vec![event; events],
            watched: 1,
        })
    }

    /// Starts a watch against the fake, which answers ready; the watch's id.
    async fn started(client: &AgentClient, fake: &mut Fake) -> (WatchStream, u32) {
        let start = client.watch(request());
        let answer = async {
            let frame = fake.recv().await;
            assert_eq!(frame.kind, Kind::WatchStart);
            fake.send(frame.id, batch(0)).await;
            frame.id
        };
        let (stream, id) = tokio::join!(start, answer);
        let (stream, watched) = stream.expect("started");
        assert_eq!(watched, 1);
        (stream, id)
    }

    #[tokio::test]
    async fn batches_past_the_window_end_the_watch_and_its_drop_stops_it() {
        let (client, mut fake) = pair().await;
        let (mut stream, id) = started(&client, &mut fake).await;
        for _ in 0..=WATCH_WINDOW {
            fake.send(id, batch(1)).await;
        }
        let mut got = 0;
        while let Some(item) = stream.recv().await {
            assert!(matches!(item, WatchItem::Batch(_)));
            got += 1;
        }
        assert_eq!(
            got, WATCH_WINDOW,
            "the batch past the window is not passed on"
        );
        drop(stream);
        let stop = fake.recv().await;
        assert_eq!((stop.id, stop.kind), (id, Kind::WatchStop));
        // The link itself is fine.
        assert!(!client.is_closed());
    }

    #[tokio::test]
    async fn an_oversized_batch_or_a_late_first_event_ends_the_watch() {
        let (client, mut fake) = pair().await;
        let (mut stream, id) = started(&client, &mut fake).await;
        fake.send(id, batch(MAX_BATCH_EVENTS + 1)).await;
        assert_eq!(stream.recv().await, None);
        drop(stream);
        let stop = fake.recv().await;
        assert_eq!((stop.id, stop.kind), (id, Kind::WatchStop));
        // A first batch that is not empty is no ready answer.
        let start = client.watch(request());
        let answer = async {
            let frame = fake.recv().await;
            fake.send(frame.id, batch(1)).await;
        };
        let (refused, ()) = tokio::join!(start, answer);
        assert!(matches!(refused, Err(AgentError::Unexpected(_))));
        // And it is stopped there.
        assert_eq!(fake.recv().await.kind, Kind::WatchStop);
    }

    #[tokio::test]
    async fn acks_and_the_end_pass_and_an_error_end_is_the_fs_error() {
        let (client, mut fake) = pair().await;
        let (mut stream, id) = started(&client, &mut fake).await;
        fake.send(id, batch(2)).await;
        assert!(matches!(stream.recv().await, Some(WatchItem::Batch(b)) if b.events.len() == 2));
        stream.passed_on().await.unwrap();
        let ack = fake.recv().await;
        assert_eq!((ack.id, ack.kind), (id, Kind::WatchAck));
        fake.send(id, Message::WatchEnd(WatchEnd { error: None }))
            .await;
        assert_eq!(
            stream.recv().await,
            Some(WatchItem::End(WatchEnd { error: None }))
        );
        assert_eq!(stream.recv().await, None);
        let start = client.watch(request());
        let answer = async {
            let frame = fake.recv().await;
            let error = crate::FsError::new(crate::FsErrorCode::NotFound, "/w: gone");
            let end = WatchEnd { error: Some(error) };
            fake.send(frame.id, Message::WatchEnd(end)).await;
        };
        let (refused, ()) = tokio::join!(start, answer);
        assert!(
            matches!(&refused, Err(AgentError::Fs(e)) if e.code == crate::FsErrorCode::NotFound),
            "{:?}",
            refused.err()
        );
    }

    #[tokio::test]
    async fn an_agent_without_the_feature_is_never_sent_a_watch() {
        let (host_end, agent_end) = duplex(64 * 1024);
        let (hr, hw) = split(host_end);
        let (ar, aw) = split(agent_end);
        let mut fake = Fake {
            reader: ar,
            writer: aw,
        };
        fake.send(0, Message::Hello(Hello::new("old"))).await;
        let client = AgentClient::connect(hr, hw).await.expect("connects");
        let refused = client.watch(request()).await;
        assert!(matches!(refused, Err(AgentError::Unsupported(_))));
    }
}
