//! One end of a byte channel: a reader socket drains the queue, a writer socket fills it.

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::channels::{ChannelEnd, Direction};
use crate::state::SharedRef;

pub async fn serve_channel(
    shared: SharedRef,
    mut ws: WebSocketStream<TcpStream>,
    channel_id: String,
    key: String,
    dir: Direction,
) {
    let end = shared.lock().channels.take(&channel_id, &key, dir);
    match end {
        ChannelEnd::Reader(mut rx) => {
            while let Some(frame) = rx.recv().await {
                if ws.send(frame).await.is_err() {
                    return;
                }
            }
            // The writer is done: closing tells the reader the stream ended.
            let _ = ws.close(None).await;
        }
        ChannelEnd::Writer(tx) => {
            while let Some(Ok(frame)) = ws.next().await {
                let forwarded = matches!(frame, Message::Binary(_) | Message::Text(_));
                let closed = matches!(frame, Message::Close(_));
                if closed || (forwarded && tx.send(frame).await.is_err()) {
                    break;
                }
            }
            drop(tx);
            let _ = ws.close(None).await;
        }
        ChannelEnd::Taken => {
            tracing::debug!(channel_id = %channel_id, "channel end already taken; closing");
            let _ = ws.close(None).await;
        }
    }
}
