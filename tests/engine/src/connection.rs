//! One worker connection: writes queued frames, reads and dispatches the worker's messages,
//! and cleans up when the socket ends.

use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::functions::FunctionDef;
use crate::invoke::{self, Call};
use crate::registration;
use crate::state::SharedRef;
use crate::wire::{self, Inbound};
use crate::worker::Outgoing;

pub async fn serve_worker(
    shared: SharedRef,
    ws: WebSocketStream<TcpStream>,
    ip_address: Option<String>,
) {
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker_id = registration::connect(&shared, ip_address, tx);
    loop {
        tokio::select! {
            outgoing = rx.recv() => match outgoing {
                Some(Outgoing::Frame(text)) => {
                    if sink.send(Message::Text(text.into())).await.is_err() {
                        break;
                    }
                }
                Some(Outgoing::Close) | None => {
                    let _ = sink.send(Message::Close(None)).await;
                    break;
                }
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Text(text))) => handle_frame(&shared, &worker_id, text.as_str()),
                Some(Ok(Message::Binary(bytes))) => match std::str::from_utf8(&bytes) {
                    Ok(text) => handle_frame(&shared, &worker_id, text),
                    Err(_) => tracing::debug!(worker_id = %worker_id, "binary frame is not UTF-8; ignored"),
                },
                Some(Ok(Message::Ping(payload))) => {
                    if sink.send(Message::Pong(payload)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
        }
    }
    registration::disconnect(&mut shared.lock(), &worker_id);
}

/// Decodes one JSON message and acts on it. Malformed or unknown messages are ignored.
pub fn handle_frame(shared: &SharedRef, worker_id: &str, text: &str) {
    let raw: Value = match serde_json::from_str(text) {
        Ok(raw) => raw,
        Err(error) => {
            tracing::debug!(worker_id, %error, "frame is not JSON; ignored");
            return;
        }
    };
    let message = match Inbound::deserialize(&raw) {
        Ok(message) => message,
        Err(error) => {
            tracing::debug!(worker_id, %error, "malformed message; ignored");
            return;
        }
    };
    match message {
        Inbound::RegisterFunction {
            id,
            description,
            request_format,
            response_format,
            metadata,
            invocation,
        } => {
            let def = FunctionDef {
                id,
                description,
                request_format,
                response_format,
                metadata,
                invocation,
            };
            registration::register_function(shared, worker_id, def);
        }
        Inbound::UnregisterFunction { id } => {
            registration::unregister_function(&mut shared.lock(), worker_id, &id);
        }
        Inbound::InvokeFunction {
            invocation_id,
            function_id,
            namespace,
        } => {
            let call = Call {
                invocation_id,
                function_id,
                namespace,
            };
            let http = invoke::invoke(&mut shared.lock(), worker_id, call, raw);
            if let Some(http) = http {
                invoke::spawn_http(shared, http);
            }
        }
        Inbound::InvocationResult { invocation_id } => {
            invoke::complete(&mut shared.lock(), worker_id, &invocation_id, raw);
        }
        Inbound::RegisterTriggerType { id, description } => {
            let mut state = shared.lock();
            let state = &mut *state;
            state.triggers.register_type(
                &state.workers,
                worker_id,
                id,
                description.unwrap_or_default(),
            );
        }
        Inbound::UnregisterTriggerType { id } => {
            shared.lock().triggers.unregister_type(worker_id, &id);
        }
        Inbound::RegisterTrigger => {
            let mut state = shared.lock();
            let state = &mut *state;
            state.triggers.register(&state.workers, worker_id, &raw);
        }
        Inbound::UnregisterTrigger { id } => {
            let mut state = shared.lock();
            let state = &mut *state;
            state.triggers.unregister(&state.workers, &id);
        }
        Inbound::TriggerRegistrationResult => {
            let mut state = shared.lock();
            let state = &mut *state;
            state.triggers.result(&state.workers, worker_id, &raw);
        }
        Inbound::Ping => {
            shared.lock().workers.send(worker_id, &wire::pong());
        }
        Inbound::Reattach {
            previous_worker_id,
            reattach_token,
        } => registration::reattach(
            &mut shared.lock(),
            worker_id,
            &previous_worker_id,
            reattach_token.as_deref(),
        ),
        Inbound::Unknown => tracing::debug!(worker_id, "unknown message type; ignored"),
    }
}
