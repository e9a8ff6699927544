//! A tiny client that speaks the raw worker protocol: call functions, register and serve
//! them by hand, send any frame. For testing the engine itself, and for calling the adapter
//! without the SDK.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::{self, Message};

/// Code of the error `invoke` returns when no answer came within its timeout.
pub const CLIENT_TIMEOUT: &str = "client_timeout";
/// Code of the error `invoke` returns when the connection ended before the answer.
pub const CLIENT_DISCONNECTED: &str = "client_disconnected";

/// An error a call returned: the remote `error.code`/`error.message` unchanged, or one of
/// [`CLIENT_TIMEOUT`] / [`CLIENT_DISCONNECTED`] for failures on this side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RemoteError {
    pub code: String,
    pub message: String,
}

impl RemoteError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("websocket connect failed: {0}")]
    WebSocket(#[from] tungstenite::Error),
    #[error("the engine closed the connection before greeting it")]
    NoGreeting,
    #[error("the engine's first message was not workerregistered: {0}")]
    BadGreeting(String),
}

type PendingMap = Arc<Mutex<HashMap<String, oneshot::Sender<Result<Value, RemoteError>>>>>;

/// One worker connection. Answers to this client's own calls resolve `invoke`; every other
/// message (calls to serve, rejections, pongs) waits in an inbox for [`Client::next_message`].
pub struct Client {
    worker_id: String,
    reattach_token: String,
    out: mpsc::UnboundedSender<Message>,
    pending: PendingMap,
    inbox: tokio::sync::Mutex<mpsc::UnboundedReceiver<Value>>,
    connected: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Client {
    /// Connects and waits for the engine's `workerregistered`.
    pub async fn connect(url: &str) -> Result<Client, ConnectError> {
        // Nagle off: small frames go out at once, as the SDK does with this engine.
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
        let (mut sink, mut stream) = ws.split();
        let greeting = loop {
            match stream.next().await {
                Some(Ok(Message::Text(text))) => break text.to_string(),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(ConnectError::WebSocket(e)),
                None => return Err(ConnectError::NoGreeting),
            }
        };
        let hello: Value = serde_json::from_str(&greeting)
            .map_err(|_| ConnectError::BadGreeting(greeting.clone()))?;
        let field = |name: &str| hello.get(name).and_then(Value::as_str).map(str::to_string);
        let (Some("workerregistered"), Some(worker_id), Some(reattach_token)) = (
            hello.get("type").and_then(Value::as_str),
            field("worker_id"),
            field("reattach_token"),
        ) else {
            return Err(ConnectError::BadGreeting(greeting));
        };

        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        let (inbox_tx, inbox_rx) = mpsc::unbounded_channel();
        let pending: PendingMap = Arc::default();
        let reader_pending = pending.clone();
        let connected = Arc::new(AtomicBool::new(true));
        let reader_connected = connected.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    outgoing = out_rx.recv() => match outgoing {
                        Some(message) => {
                            if sink.send(message).await.is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                    incoming = stream.next() => match incoming {
                        Some(Ok(Message::Text(text))) => {
                            route_incoming(text.as_str(), &reader_pending, &inbox_tx);
                        }
                        Some(Ok(Message::Binary(bytes))) => {
                            route_incoming(&String::from_utf8_lossy(&bytes), &reader_pending, &inbox_tx);
                        }
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                        Some(Ok(_)) => {}
                    },
                }
            }
            // Cleared before the inbox closes, so a reader that saw the end sees it here too.
            reader_connected.store(false, Ordering::SeqCst);
            // Dropping the senders fails every call still waiting.
            reader_pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        });
        Ok(Client {
            worker_id,
            reattach_token,
            out,
            pending,
            inbox: tokio::sync::Mutex::new(inbox_rx),
            connected,
            task,
        })
    }

    /// The id the engine gave this connection.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    pub fn reattach_token(&self) -> &str {
        &self.reattach_token
    }

    /// Calls `function_id` in namespace `default` and waits up to `timeout` for its answer.
    pub async fn invoke(
        &self,
        function_id: &str,
        data: Value,
        timeout: Duration,
    ) -> Result<Value, RemoteError> {
        self.invoke_in(crate::DEFAULT_NAMESPACE, function_id, data, timeout)
            .await
    }

    /// Calls `function_id` in `namespace`.
    pub async fn invoke_in(
        &self,
        namespace: &str,
        function_id: &str,
        data: Value,
        timeout: Duration,
    ) -> Result<Value, RemoteError> {
        let invocation_id = uuid::Uuid::new_v4().to_string();
        let (tx, rx) = oneshot::channel();
        self.pending_map().insert(invocation_id.clone(), tx);
        self.send(json!({
            "type": "invokefunction",
            "invocation_id": invocation_id,
            "function_id": function_id,
            "data": data,
            "namespace": namespace,
        }))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(disconnected()),
            Err(_) => {
                self.pending_map().remove(&invocation_id);
                Err(RemoteError::new(
                    CLIENT_TIMEOUT,
                    format!("no answer from {function_id} within {timeout:?}"),
                ))
            }
        }
    }

    /// Polls `engine::functions::info` until `function_id` is registered (in `namespace`, or
    /// anywhere when `None`); registration is asynchronous, so tests wait with this.
    pub async fn wait_for_function(
        &self,
        function_id: &str,
        namespace: Option<&str>,
        timeout: Duration,
    ) -> Result<(), RemoteError> {
        let deadline = deadline_after(timeout);
        let mut query = json!({ "function_id": function_id });
        if let Some(namespace) = namespace {
            query["namespace"] = json!(namespace);
        }
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self
                .invoke("engine::functions::info", query.clone(), left)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.code == CLIENT_DISCONNECTED || e.code == CLIENT_TIMEOUT => {
                    return Err(e)
                }
                Err(_) if left.is_zero() => {
                    return Err(RemoteError::new(
                        CLIENT_TIMEOUT,
                        format!("{function_id} was not registered within {timeout:?}"),
                    ))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Sends any JSON message as one text frame.
    pub fn send(&self, message: Value) -> Result<(), RemoteError> {
        self.out
            .send(Message::Text(message.to_string().into()))
            .map_err(|_| disconnected())
    }

    /// Sends a WebSocket ping (the answer arrives as a pong frame, not in the inbox).
    pub fn ping(&self) -> Result<(), RemoteError> {
        self.out
            .send(Message::Ping(Vec::new().into()))
            .map_err(|_| disconnected())
    }

    /// Offers `id` with optional schemas (`registerfunction`).
    pub fn register_function(
        &self,
        id: &str,
        description: Option<&str>,
        request_format: Option<Value>,
        response_format: Option<Value>,
    ) -> Result<(), RemoteError> {
        let mut message = json!({ "type": "registerfunction", "id": id });
        let fields = [
            ("description", description.map(|d| json!(d))),
            ("request_format", request_format),
            ("response_format", response_format),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                message[name] = value;
            }
        }
        self.send(message)
    }

    /// Announces this worker's name and namespace (`engine::workers::register`,
    /// fire-and-forget, as the SDK does).
    pub fn announce(&self, name: &str, namespace: Option<&str>) -> Result<(), RemoteError> {
        let mut data = json!({
            "name": name, "runtime": "rust", "version": env!("CARGO_PKG_VERSION"),
            "os": std::env::consts::OS, "pid": std::process::id(),
        });
        if let Some(namespace) = namespace {
            data["namespace"] = json!(namespace);
        }
        self.send(json!({
            "type": "invokefunction",
            "function_id": "engine::workers::register",
            "data": data,
            "action": {"type": "void"},
        }))
    }

    /// Answers a call this client received (`invocationresult`).
    pub fn answer(
        &self,
        invocation_id: &str,
        function_id: &str,
        outcome: Result<Value, RemoteError>,
    ) -> Result<(), RemoteError> {
        let mut message = json!({
            "type": "invocationresult",
            "invocation_id": invocation_id,
            "function_id": function_id,
        });
        match outcome {
            Ok(result) => message["result"] = result,
            Err(e) => message["error"] = json!({"code": e.code, "message": e.message}),
        }
        self.send(message)
    }

    /// The next message that is not an answer to this client's own call, or `None` on
    /// timeout or when the connection has ended and the inbox is empty.
    pub async fn next_message(&self, timeout: Duration) -> Option<Value> {
        let mut inbox = self.inbox.lock().await;
        tokio::time::timeout(timeout, inbox.recv())
            .await
            .ok()
            .flatten()
    }

    /// Waits for the next message of `type`, skipping others.
    pub async fn next_of_type(&self, kind: &str, timeout: Duration) -> Option<Value> {
        let deadline = deadline_after(timeout);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let message = self.next_message(left).await?;
            if message.get("type").and_then(Value::as_str) == Some(kind) {
                return Some(message);
            }
        }
    }

    /// Whether the connection is still open.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst) && !self.task.is_finished()
    }

    /// Closes the connection abruptly (no close handshake), like a crashed worker.
    pub fn abort(&self) {
        self.task.abort();
    }

    fn pending_map(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Result<Value, RemoteError>>>>
    {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn route_incoming(text: &str, pending: &PendingMap, inbox: &mpsc::UnboundedSender<Value>) {
    let Ok(message) = serde_json::from_str::<Value>(text) else {
        return;
    };
    if message.get("type").and_then(Value::as_str) == Some("invocationresult") {
        let id = message.get("invocation_id").and_then(Value::as_str);
        let waiter = id.and_then(|id| {
            pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(id)
        });
        if let Some(waiter) = waiter {
            let _ = waiter.send(outcome_of(&message));
            return;
        }
    }
    let _ = inbox.send(message);
}

fn outcome_of(message: &Value) -> Result<Value, RemoteError> {
    match message.get("error").filter(|e| !e.is_null()) {
        Some(error) => {
            let text = |name: &str| {
                error
                    .get(name)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            Err(RemoteError::new(text("code"), text("message")))
        }
        None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
    }
}

/// `now + timeout`, saturating: `Duration::MAX` means "no deadline" rather than a panic.
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

fn disconnected() -> RemoteError {
    RemoteError::new(
        CLIENT_DISCONNECTED,
        "the connection to the engine has ended",
    )
}
