//! The sockets of one guest connection: the guest's WebSocket, the guard's own WebSocket to
//! the engine at the same path, and the frames between them. A worker connection's frames
//! are judged by its [`Session`]; a channel's (`/ws/channels/...`) are bytes of a stream the
//! engine already authorised by its key, passed on as they are.
//!
//! Each side is written by a task of its own fed through a bounded queue, so a side that
//! stops reading holds back only this connection, and the guest's messages reach the engine
//! at a bounded rate ([`RATE`]).

use std::time::Duration;

use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::session::{Context, Out, Session};

/// Messages a guest's connection may send the engine per second (with as large a burst):
/// far above what a worker needs, low enough that a flood costs the engine little.
pub const RATE: u32 = 2000;
/// Frames queued for one side before the relay waits for it.
const QUEUE: usize = 256;

/// Relays a worker connection until either side ends, a guest message is malformed, or
/// `closed` fires.
pub(crate) async fn worker<G, E>(
    guest: WebSocketStream<G>,
    engine: WebSocketStream<E>,
    ctx: Context,
    mut closed: watch::Receiver<()>,
) where
    G: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    E: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (guest_sink, mut guest_rx) = guest.split();
    let (engine_sink, mut engine_rx) = engine.split();
    let (to_guest, guest_writer) = writer(guest_sink);
    let (to_engine, engine_writer) = writer(engine_sink);
    let mut session = Session::new(ctx.clone());
    let mut bucket = Bucket::new(RATE);
    let mut out = Vec::new();
    let ending = loop {
        tokio::select! {
            _ = closed.changed() => break "the sandbox stopped",
            frame = guest_rx.next() => match data(frame) {
                Step::Data(message) => {
                    if let Err(malformed) = session.judge_guest(&message, &mut out) {
                        ctx.log_malformed(&malformed);
                        break "a malformed message from the guest";
                    }
                }
                Step::Skip => continue,
                Step::End(why) => break why.guest(),
            },
            frame = engine_rx.next() => match data(frame) {
                Step::Data(message) => session.judge_engine(&message, &mut out),
                Step::Skip => continue,
                Step::End(_) => break "the engine closed the connection",
            },
        }
        let mut close = false;
        for step in out.drain(..) {
            let sent = match step {
                Out::Engine(message) => {
                    bucket.take().await;
                    to_engine.send(message).await.is_ok()
                }
                Out::Guest(message) => to_guest.send(message).await.is_ok(),
                Out::Close => {
                    close = true;
                    true
                }
            };
            close |= !sent;
        }
        if close {
            break "the guard ended it";
        }
    };
    session.end();
    tracing::debug!(sandbox_id = %ctx.sandbox, ending, "bus guard: a worker connection ended");
    // What is queued for the guest (a refusal that ends it) goes out before the close.
    drop(to_guest);
    let _ = tokio::time::timeout(Duration::from_secs(1), guest_writer).await;
    engine_writer.abort();
}

/// Relays a channel's frames as they are until either side ends or `closed` fires.
pub(crate) async fn channel<G, E>(
    guest: WebSocketStream<G>,
    engine: WebSocketStream<E>,
    mut closed: watch::Receiver<()>,
) where
    G: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    E: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut guest_sink, mut guest_rx) = guest.split();
    let (mut engine_sink, mut engine_rx) = engine.split();
    loop {
        tokio::select! {
            _ = closed.changed() => break,
            frame = guest_rx.next() => match data(frame) {
                Step::Data(message) => {
                    if engine_sink.send(message).await.is_err() {
                        break;
                    }
                }
                Step::Skip => {}
                Step::End(_) => {
                    let _ = engine_sink.close().await;
                    break;
                }
            },
            frame = engine_rx.next() => match data(frame) {
                Step::Data(message) => {
                    if guest_sink.send(message).await.is_err() {
                        break;
                    }
                }
                Step::Skip => {}
                Step::End(_) => {
                    let _ = guest_sink.close().await;
                    break;
                }
            },
        }
    }
}

/// Reads and drops what the guest sends until it closes or `closed` fires.
pub(crate) async fn drain<G>(mut guest: WebSocketStream<G>, mut closed: watch::Receiver<()>)
where
    G: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    loop {
        tokio::select! {
            _ = closed.changed() => return,
            frame = guest.next() => {
                if let Step::End(_) = data(frame) {
                    return;
                }
            }
        }
    }
}

enum Step {
    Data(Message),
    Skip,
    End(Why),
}

/// How a side's stream ended.
enum Why {
    Closed,
    Oversized,
    Broken,
}

impl Why {
    fn guest(&self) -> &'static str {
        match self {
            Why::Closed => "the guest closed the connection",
            Why::Oversized => "a frame or message from the guest above the bound",
            Why::Broken => "the guest's connection broke or sent a bad frame",
        }
    }
}

/// One read: a data frame, something tungstenite answers itself (ping, pong), or the end.
fn data(frame: Option<Result<Message, WsError>>) -> Step {
    match frame {
        Some(Ok(message @ (Message::Text(_) | Message::Binary(_)))) => Step::Data(message),
        Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => Step::Skip,
        Some(Ok(Message::Close(_))) | None => Step::End(Why::Closed),
        Some(Err(WsError::Capacity(_))) => Step::End(Why::Oversized),
        Some(Err(_)) => Step::End(Why::Broken),
    }
}

/// Aborts its task when dropped.
struct Writer(tokio::task::JoinHandle<()>);

impl Writer {
    fn abort(&self) {
        self.0.abort();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::future::Future for Writer {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// A task writing what its queue holds to `sink`, flushing when the queue is empty.
fn writer<S>(mut sink: SplitSink<WebSocketStream<S>, Message>) -> (mpsc::Sender<Message>, Writer)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Message>(QUEUE);
    let task = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            if sink.feed(message).await.is_err() {
                return;
            }
            while let Ok(message) = rx.try_recv() {
                if sink.feed(message).await.is_err() {
                    return;
                }
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
    (tx, Writer(task))
}

/// A token bucket: `rate` messages a second, as large a burst.
struct Bucket {
    rate: f64,
    tokens: f64,
    at: tokio::time::Instant,
}

impl Bucket {
    fn new(rate: u32) -> Bucket {
        Bucket {
            rate: f64::from(rate),
            tokens: f64::from(rate),
            at: tokio::time::Instant::now(),
        }
    }

    async fn take(&mut self) {
        let now = tokio::time::Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.rate);
        self.at = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.at = tokio::time::Instant::now();
        }
        self.tokens -= 1.0;
    }
}
