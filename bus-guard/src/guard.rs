//! The guard's endpoints: one listener per sandbox on the host's loopback, where that
//! sandbox's forward (and nothing else of it) connects. A connection is the guest's
//! WebSocket; the guard opens its own to the engine at the same path and relays
//! (`relay.rs`). Dropping a sandbox's [`SandboxBus`] ends its listener and every connection
//! at once, so the engine drops the guest's functions.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::limits::Shared;
use crate::policy::Policy;
use crate::relay;
use crate::session::Context;

/// The largest message and frame a guest may send: what the guard holds in memory for one
/// connection at worst. The SDKs send a message up to 16 MiB as one frame (Python's
/// `_MAX_JSON_FRAME_BYTES`) and channel data in 64 KiB frames; the protocol's 64 MiB
/// messages are for the engine's trusted workers, and larger data goes through channels.
pub const MAX_GUEST_MESSAGE: usize = 16 << 20;
/// What the engine may send through the guard: the protocol's largest message.
pub const MAX_ENGINE_MESSAGE: usize = 64 << 20;
/// Connections one sandbox holds at once (a worker's own and its channels'); more are closed
/// as they come.
pub const MAX_CONNECTIONS: usize = 16;
/// How long the guest's upgrade and the guard's connection to the engine may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The guard of one adapter: the engine's address and the policy, for every sandbox, and
/// the guard's own runtime: one thread, apart from the adapter's, so what guests make the
/// guard do (a flood of messages) takes that thread and never the ones serving `exec` and
/// the other calls.
#[derive(Clone)]
pub struct BusGuard {
    engine: Arc<str>,
    policy: Arc<Policy>,
    handle: tokio::runtime::Handle,
    _runtime: Arc<OwnRuntime>,
}

impl BusGuard {
    /// `engine_url` is the adapter's own (`III_URL`): its scheme and authority are kept, the
    /// guest's path is put after them.
    pub fn new(engine_url: &str, policy: Policy) -> std::io::Result<BusGuard> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bus-guard")
            .enable_all()
            .build()?;
        Ok(BusGuard {
            engine: Arc::from(engine_base(engine_url)),
            policy: Arc::new(policy),
            handle: runtime.handle().clone(),
            _runtime: Arc::new(OwnRuntime(Some(runtime))),
        })
    }

    /// A guarded endpoint for sandbox `sandbox_id` under the guard's own policy, listening
    /// until the handle is dropped.
    pub fn open(&self, sandbox_id: &str) -> std::io::Result<SandboxBus> {
        self.open_with(sandbox_id, Arc::clone(&self.policy))
    }

    /// A guarded endpoint for `id` under `policy` (a worker VM's: [`Policy::worker_vm`]),
    /// listening until the handle is dropped.
    pub fn open_with(&self, id: &str, policy: Arc<Policy>) -> std::io::Result<SandboxBus> {
        let sandbox_id = id;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let bus = SandboxBus::new(listener.local_addr()?);
        let ctx = Context {
            sandbox: Arc::from(sandbox_id),
            policy,
            functions: Arc::clone(&bus.functions),
            shared: Arc::new(Shared::default()),
        };
        let (engine, closed) = (Arc::clone(&self.engine), bus.closed.subscribe());
        self.handle.spawn(async move {
            // Made into the runtime's socket on its own thread.
            if let Ok(listener) = TcpListener::from_std(listener) {
                serve(listener, engine, ctx, closed).await;
            }
        });
        Ok(bus)
    }
}

/// The guard's runtime, let go without waiting when the last guard goes (it may go inside
/// another runtime, where a blocking shutdown is not allowed).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// One sandbox's endpoint. Dropped (or [`SandboxBus::close`]d), it stops listening and ends
/// every connection of the sandbox.
pub struct SandboxBus {
    addr: SocketAddr,
    functions: Arc<AtomicUsize>,
    closed: watch::Sender<()>,
}

impl SandboxBus {
    fn new(addr: SocketAddr) -> SandboxBus {
        SandboxBus {
            addr,
            functions: Arc::new(AtomicUsize::new(0)),
            closed: watch::channel(()).0,
        }
    }

    /// Where the sandbox's forward connects (the host's loopback, a port of its own).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Functions the sandbox serves on the bus now (registered through the guard, not
    /// refused by the engine, not unregistered, connection alive).
    pub fn functions(&self) -> usize {
        self.functions.load(Ordering::Relaxed)
    }

    /// Ends the endpoint and every connection at once.
    pub fn close(self) {}
}

/// Accepts the sandbox's connections until `closed` fires.
async fn serve(
    listener: TcpListener,
    engine: Arc<str>,
    ctx: Context,
    mut closed: watch::Receiver<()>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let socket = tokio::select! {
            _ = closed.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(_) => {
                    // EMFILE and the like pass.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            ctx.log("connection", "the sandbox's connection ceiling", None);
            continue;
        }
        let (engine, ctx, closed, active) = (
            Arc::clone(&engine),
            ctx.clone(),
            closed.clone(),
            Arc::clone(&active),
        );
        tokio::spawn(async move {
            connection(socket, &engine, ctx, closed).await;
            active.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Where a guest's upgrade asked to go.
enum Route {
    Worker,
    /// The engine's telemetry endpoint (`/otel`, where the Python SDK sends its spans, logs
    /// and metrics by default): taken and dropped here. A guest's telemetry never reaches the
    /// operator's trace store (it could name any worker), and its SDK stays quiet.
    Telemetry,
    /// The path and query to ask the engine for.
    Channel(String),
}

/// One guest connection: its upgrade, the guard's own to the engine, then the relay.
async fn connection(socket: TcpStream, engine: &str, ctx: Context, closed: watch::Receiver<()>) {
    let _ = socket.set_nodelay(true);
    let mut route = Route::Worker;
    let choose = |request: &Request, response: Response| {
        let uri = request.uri();
        match uri.path() {
            "" | "/" => Ok(response),
            "/otel" => {
                route = Route::Telemetry;
                Ok(response)
            }
            path if path.starts_with("/ws/channels/") => {
                route = Route::Channel(
                    uri.path_and_query()
                        .map_or(path.to_string(), |p| p.as_str().to_string()),
                );
                Ok(response)
            }
            _ => Err(not_found()),
        }
    };
    let guest_config = WebSocketConfig::default()
        .max_message_size(Some(MAX_GUEST_MESSAGE))
        .max_frame_size(Some(MAX_GUEST_MESSAGE));
    let upgrade =
        tokio_tungstenite::accept_hdr_async_with_config(socket, choose, Some(guest_config));
    let guest = match tokio::time::timeout(HANDSHAKE_TIMEOUT, upgrade).await {
        Ok(Ok(guest)) => guest,
        _ => return,
    };
    let url = match &route {
        Route::Worker => format!("{engine}/"),
        Route::Channel(path) => format!("{engine}{path}"),
        Route::Telemetry => return relay::drain(guest, closed).await,
    };
    let engine_config = WebSocketConfig::default()
        .max_message_size(Some(MAX_ENGINE_MESSAGE))
        .max_frame_size(Some(MAX_ENGINE_MESSAGE));
    let upstream = tokio_tungstenite::connect_async_with_config(url, Some(engine_config), true);
    let engine = match tokio::time::timeout(HANDSHAKE_TIMEOUT, upstream).await {
        Ok(Ok((engine, _))) => engine,
        _ => {
            // The guest's SDK reconnects as it would to an engine that is down.
            tracing::debug!(sandbox_id = %ctx.sandbox, "bus guard: the engine is unreachable");
            return;
        }
    };
    match route {
        Route::Worker => relay::worker(guest, engine, ctx, closed).await,
        Route::Channel(_) => relay::channel(guest, engine, closed).await,
        Route::Telemetry => {}
    }
}

fn not_found() -> ErrorResponse {
    let mut response = ErrorResponse::new(Some("not found".into()));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// `scheme://authority` of the engine's URL (`ws://127.0.0.1:49134/` -> `ws://127.0.0.1:49134`).
fn engine_base(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("ws", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    format!("{scheme}://{authority}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_base_keeps_scheme_and_authority() {
        assert_eq!(engine_base("ws://127.0.0.1:49134"), "ws://127.0.0.1:49134");
        assert_eq!(engine_base("ws://localhost:1/x?y"), "ws://localhost:1");
        assert_eq!(engine_base("127.0.0.1:7"), "ws://127.0.0.1:7");
        assert_eq!(engine_base("wss://[::1]:9/"), "wss://[::1]:9");
    }
}
