//! The listener: starts and stops an engine, and routes each upgrade to a worker connection
//! or a channel end by its path.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::channel_socket::serve_channel;
use crate::channels::{parse_channel_path, Direction};
use crate::connection::serve_worker;
use crate::env::EngineEnv;
use crate::http_function::UrlPolicy;
use crate::state::{Shared, SharedRef, State};

/// Largest JSON message, as in the real engine.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Upgrade response header listing transport capabilities; the SDK reads `tcp-nodelay`.
const CAPABILITIES_HEADER: &str = "x-iii-capabilities";
const DEFAULT_REGISTRATION_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Entry point: `Engine::start(addr)`, or `Engine::with_config(..)` for a configured engine.
#[derive(Debug)]
pub struct Engine;

impl Engine {
    /// Starts an engine with no configuration on `listen` (port 0 picks a free port).
    pub async fn start(listen: SocketAddr) -> Result<EngineHandle, EngineError> {
        EngineBuilder::default().start(listen).await
    }

    /// A builder with one configuration entry pre-seeded.
    pub fn with_config(id: impl Into<String>, value: Value) -> EngineBuilder {
        EngineBuilder::default().with_config(id, value)
    }

    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }
}

/// How to start an engine; kept by the handle so a restart starts the same engine again.
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    config: Vec<(String, Value)>,
    registration_grace: Duration,
    env: EngineEnv,
    url_policy: UrlPolicy,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            config: Vec::new(),
            registration_grace: DEFAULT_REGISTRATION_GRACE,
            env: EngineEnv::default(),
            url_policy: UrlPolicy::default(),
        }
    }
}

impl EngineBuilder {
    /// Pre-seeds configuration entry `id` (readable with `configuration::get`).
    pub fn with_config(mut self, id: impl Into<String>, value: Value) -> Self {
        self.config.push((id.into(), value));
        self
    }

    /// How long registrations wait for `engine::workers::register` (5 s, as the real engine).
    pub fn registration_grace(mut self, grace: Duration) -> Self {
        self.registration_grace = grace;
        self
    }

    /// Sets variable `name` in the engine's environment (over the process's), for
    /// `${VAR}` expansion and HTTP functions' credentials: a test gives the engine a secret
    /// without changing its own process's environment.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.set(name, value);
        self
    }

    /// Which URLs HTTP-invoked functions may name ([`UrlPolicy::permissive`] unless set).
    pub fn http_url_policy(mut self, policy: UrlPolicy) -> Self {
        self.url_policy = policy;
        self
    }

    pub async fn start(&self, listen: SocketAddr) -> Result<EngineHandle, EngineError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| EngineError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| EngineError::Bind {
            addr: listen,
            source,
        })?;
        let mut state = State {
            env: self.env.clone(),
            url_policy: self.url_policy,
            ..State::default()
        };
        for (id, value) in &self.config {
            state.config.seed(id, value.clone());
        }
        let shared = Shared::new(state, self.registration_grace);
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        tracing::info!(%addr, "engine listening");
        Ok(EngineHandle {
            addr,
            shared,
            builder: self.clone(),
            stop: Some(stop_tx),
            task: Some(task),
        })
    }
}

/// Counts of what an engine holds (see [`EngineHandle::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Live worker connections.
    pub workers: usize,
    /// Registered functions, every namespace.
    pub functions: usize,
    /// Channels created and not yet taken apart.
    pub channels: usize,
    /// Bytes of the registered functions' `request_format` and `response_format`, as JSON.
    pub schema_bytes: usize,
}

/// A running engine. Dropping it stops the engine too.
#[derive(Debug)]
pub struct EngineHandle {
    addr: SocketAddr,
    shared: SharedRef,
    builder: EngineBuilder,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl EngineHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `ws://ADDR`, what workers and the SDK connect to.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// What the engine holds now: how much a worker made it keep.
    pub fn stats(&self) -> EngineStats {
        let state = self.shared.lock();
        let schema_bytes = state
            .functions
            .all()
            .map(|e| {
                let size = |v: &Option<Value>| v.as_ref().map_or(0, |v| v.to_string().len());
                size(&e.def.request_format) + size(&e.def.response_format)
            })
            .sum();
        EngineStats {
            workers: state.workers.len(),
            functions: state.functions.len(),
            channels: state.channels.len(),
            schema_bytes,
        }
    }

    /// Trigger types workers provide, and bindings (live or waiting for their type).
    pub fn trigger_counts(&self) -> (usize, usize) {
        let state = self.shared.lock();
        (state.triggers.type_count(), state.triggers.binding_count())
    }

    /// Stops listening and drops every connection at once, like a killed engine.
    pub async fn shutdown(mut self) {
        self.stop_now().await;
    }

    /// Shuts down, then starts a fresh engine (same configuration seeds) on the same address.
    pub async fn restart(mut self) -> Result<EngineHandle, EngineError> {
        self.stop_now().await;
        self.builder.start(self.addr).await
    }

    async fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        tracing::info!(addr = %self.addr, "engine stopped");
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: SharedRef, mut stop: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    connections.spawn(serve_socket(shared.clone(), socket, peer));
                }
                Err(error) => tracing::warn!(%error, "accept failed"),
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    // Aborting drops every socket: peers see the connection vanish.
    connections.shutdown().await;
}

/// Where an upgrade asked to go.
enum Route {
    Worker,
    Channel {
        id: String,
        key: String,
        dir: Direction,
    },
}

async fn serve_socket(shared: SharedRef, socket: TcpStream, peer: SocketAddr) {
    // The capability header promises TCP_NODELAY on our end.
    let _ = socket.set_nodelay(true);
    let mut route = Route::Worker;
    let check_shared = shared.clone();
    let callback = |request: &Request, mut response: Response| {
        response
            .headers_mut()
            .insert(CAPABILITIES_HEADER, HeaderValue::from_static("tcp-nodelay"));
        let uri = request.uri();
        let Some((id, key, dir)) = parse_channel_path(uri.path(), uri.query()) else {
            return Ok(response);
        };
        let dir = Direction::parse(&dir);
        match dir {
            Some(dir) if check_shared.lock().channels.authorizes(&id, &key, dir) => {
                route = Route::Channel { id, key, dir };
                Ok(response)
            }
            _ => Err(not_found()),
        }
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    let ws = match tokio_tungstenite::accept_hdr_async_with_config(socket, callback, Some(config))
        .await
    {
        Ok(ws) => ws,
        Err(error) => {
            tracing::debug!(%peer, %error, "upgrade refused or failed");
            return;
        }
    };
    match route {
        Route::Worker => serve_worker(shared, ws, Some(peer.ip().to_string())).await,
        Route::Channel { id, key, dir } => serve_channel(shared, ws, id, key, dir).await,
    }
}

fn not_found() -> ErrorResponse {
    let mut response = ErrorResponse::new(Some("Channel not found".to_string()));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}
