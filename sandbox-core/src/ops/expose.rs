//! `port::expose` / `port::close`: a server listening in a sandbox on a port (any interface,
//! its loopback included) reached from the host at `http://<expose_address>:<host port>`.
//!
//! Each exposure is a listener on the host whose every connection is relayed through the
//! sandbox's agent to the port on the guest's loopback (a TCP stream of the agent protocol,
//! flow-controlled each way). So it works on every backend, with or without `network`, and
//! opens nothing else: no other port, no egress, no route into the sandbox.
//!
//! Lifecycle: the exposures belong to the sandbox's record ([`Exposures`]); they close when
//! the sandbox stops (any cause: `stop`, idle, dead agent, adapter shutdown) and when it
//! pauses (its listeners go, so connections are refused, not left hanging on a frozen
//! server). A resume does not reopen them: the caller exposes again and gets a fresh URL
//! (the old host port may have been taken meanwhile).
//!
//! Bounds: [`MAX_EXPOSURES`] per sandbox (S400 past it), [`MAX_CONNECTIONS`] at once per
//! exposure and [`MAX_SANDBOX_CONNECTIONS`] across a sandbox's exposures (a connection past
//! either is closed at once), [`STREAM_WINDOW`] of bytes in flight
//! each way per connection, and one [`CHUNK_SIZE`] read buffer per direction.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use agent_proto::client::{AgentClient, TcpEvent, TcpReader, TcpWriter};
use agent_proto::{AgentError, CHUNK_SIZE, FEATURE_TCP_STREAM};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::functions::{object, uuid_schema};
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{parse, sandbox_id};

/// Exposures one sandbox may hold at once.
pub const MAX_EXPOSURES: usize = 8;
/// Connections one exposure relays at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections all of one sandbox's exposures relay at once. Each costs the sandbox's agent
/// two threads, which count against the sandbox's `max_pids_per_sandbox` (1024 by default):
/// this leaves the sandbox's own programs and its execs most of it.
pub const MAX_SANDBOX_CONNECTIONS: usize = 128;
/// Flow window of each direction of one relayed connection, in the agent protocol's cost
/// units: what the adapter holds of one connection's bytes at most (the guest's side stops
/// reading its server past it).
pub const STREAM_WINDOW: u64 = 128 * 1024;
/// Pause after a failed accept (descriptors exhausted), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A sandbox's open exposures, by guest port.
pub struct Exposures {
    state: Mutex<State>,
    /// Connection slots shared by all of them ([`MAX_SANDBOX_CONNECTIONS`]).
    connections: Arc<Semaphore>,
}

impl Default for Exposures {
    fn default() -> Self {
        Exposures {
            state: Mutex::default(),
            connections: Arc::new(Semaphore::new(MAX_SANDBOX_CONNECTIONS)),
        }
    }
}

#[derive(Default)]
struct State {
    open: BTreeMap<u16, Exposure>,
    /// Paused: none may open until the resume.
    suspended: bool,
    /// Stopped: none may open again.
    shut: bool,
}

/// One listener and the relays it started; dropping it closes them all.
struct Exposure {
    url: String,
    host_port: u16,
    accept: JoinHandle<()>,
}

impl Drop for Exposure {
    fn drop(&mut self) {
        // The accept task owns the listener and the relays' JoinSet: aborting it drops both,
        // so new connections are refused and open ones end.
        self.accept.abort();
    }
}

/// Why an exposure could not be kept.
enum Refusal {
    Closed { paused: bool },
    Full,
}

impl Exposures {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `[{port, url}]`, by port, for `list`.
    pub fn listing(&self) -> Value {
        let state = self.state();
        let ports: Vec<Value> = state
            .open
            .iter()
            .map(|(port, e)| json!({"port": port, "url": e.url}))
            .collect();
        Value::Array(ports)
    }

    /// The sandbox is pausing: every exposure closes and none opens until [`Self::allow`].
    pub fn suspend(&self) {
        let closed = {
            let mut state = self.state();
            state.suspended = true;
            std::mem::take(&mut state.open)
        };
        log_closed(&closed, "the sandbox paused");
    }

    /// The sandbox runs again (resumed, or a pause that failed): exposures may open.
    pub fn allow(&self) {
        self.state().suspended = false;
    }

    /// The sandbox is stopping: every exposure closes, for good.
    pub fn shut(&self) {
        let closed = {
            let mut state = self.state();
            state.shut = true;
            std::mem::take(&mut state.open)
        };
        log_closed(&closed, "the sandbox stopped");
    }

    fn existing(&self, port: u16) -> Option<(String, u16)> {
        let state = self.state();
        state.open.get(&port).map(|e| (e.url.clone(), e.host_port))
    }

    /// Keeps `exposure` for `port`, or answers the one already there (two concurrent calls
    /// for one port get one URL; the loser's listener closes).
    fn insert(&self, port: u16, exposure: Exposure) -> Result<(String, u16), Refusal> {
        let mut state = self.state();
        if state.shut || state.suspended {
            return Err(Refusal::Closed {
                paused: !state.shut,
            });
        }
        if let Some(e) = state.open.get(&port) {
            return Ok((e.url.clone(), e.host_port));
        }
        if state.open.len() >= MAX_EXPOSURES {
            return Err(Refusal::Full);
        }
        let answer = (exposure.url.clone(), exposure.host_port);
        state.open.insert(port, exposure);
        Ok(answer)
    }

    fn remove(&self, port: u16) -> Option<Exposure> {
        self.state().open.remove(&port)
    }
}

fn log_closed(closed: &BTreeMap<u16, Exposure>, why: &str) {
    for (port, exposure) in closed {
        tracing::info!(
            port,
            host_port = exposure.host_port,
            "exposed port closed: {why}"
        );
    }
}

#[derive(Debug, Deserialize)]
struct PortRequest {
    sandbox_id: String,
    port: Value,
}

/// `port::<op>`.
pub async fn dispatch<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    op: &str,
    payload: Value,
) -> Result<Value, SandboxError> {
    match op {
        "expose" => expose(plugin, payload).await,
        "close" => close(plugin, payload),
        other => Err(SandboxError::InvalidRequest(format!(
            "unknown function `port::{other}`"
        ))),
    }
}

/// A port of 1..=65535, S001 for anything else (0, past 65535, not an integer).
fn guest_port(value: &Value) -> Result<u16, SandboxError> {
    value
        .as_u64()
        .and_then(|n| u16::try_from(n).ok())
        .filter(|port| *port != 0)
        .ok_or_else(|| {
            SandboxError::InvalidRequest(format!(
                "`port` must be an integer from 1 to 65535, got {value}"
            ))
        })
}

async fn expose<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: PortRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    let port = guest_port(&request.port)?;
    // A call in flight: the reaper leaves the sandbox alone while the listener opens.
    let (sandbox, _call) = plugin.registry.begin_call(id)?;
    if !sandbox.agent.supports(FEATURE_TCP_STREAM) {
        return Err(SandboxError::BackendUnsupported(
            "the sandbox's agent predates exposed ports; start a new sandbox".into(),
        ));
    }
    crate::ops::pause::wake(&sandbox, &plugin.events).await?;
    if let Some((url, host_port)) = sandbox.exposures.existing(port) {
        return Ok(answer(url, port, host_port));
    }
    let exposure = open(plugin.config.expose_address, port, &sandbox).await?;
    match sandbox.exposures.insert(port, exposure) {
        Ok((url, host_port)) => {
            tracing::info!(sandbox_id = %sandbox.id, port, host_port, "port exposed");
            plugin
                .events
                .emit(|| crate::events::Event::port_exposed(sandbox.id, port, host_port));
            Ok(answer(url, port, host_port))
        }
        Err(Refusal::Full) => Err(SandboxError::ResourceLimit(format!(
            "sandbox {id} already exposes {MAX_EXPOSURES} ports, its limit; close one first"
        ))),
        Err(Refusal::Closed { paused: true }) => Err(SandboxError::InvalidRequest(format!(
            "sandbox {id} was paused while its port opened; resume it and expose again"
        ))),
        Err(Refusal::Closed { paused: false }) => Err(SandboxError::Stopped(id.to_string())),
    }
}

fn close<B: Backend>(plugin: &SandboxPlugin<B>, payload: Value) -> Result<Value, SandboxError> {
    let request: PortRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    let port = guest_port(&request.port)?;
    let sandbox = plugin.registry.live_sandbox(id)?;
    if let Some(exposure) = sandbox.exposures.remove(port) {
        tracing::info!(sandbox_id = %id, port, host_port = exposure.host_port, "exposed port closed");
        plugin
            .events
            .emit(|| crate::events::Event::port_closed(id, port));
    }
    Ok(json!({}))
}

fn answer(url: String, port: u16, host_port: u16) -> Value {
    json!({"url": url, "port": port, "host_port": host_port})
}

/// A listener on `address` (a port the kernel picks) relaying to `port` in `sandbox`.
async fn open(
    address: IpAddr,
    port: u16,
    sandbox: &Arc<Sandbox>,
) -> Result<Exposure, SandboxError> {
    let listener = TcpListener::bind((address, 0)).await.map_err(|e| {
        SandboxError::ResourceLimit(format!("no port to listen on at {address}: {e}"))
    })?;
    let host_port = listener
        .local_addr()
        .map_err(|e| SandboxError::Internal(format!("the new listener has no address: {e}")))?
        .port();
    let url = format!("http://{}", SocketAddr::new(address, host_port));
    let agent = sandbox.agent.clone();
    let sandbox_slots = sandbox.exposures.connections.clone();
    let accept = tokio::spawn(accept_loop(
        listener,
        agent,
        port,
        Arc::downgrade(sandbox),
        sandbox_slots,
    ));
    Ok(Exposure {
        url,
        host_port,
        accept,
    })
}

/// Accepts until aborted; each connection relayed by a task of its own in `relays`, which
/// is dropped (every relay aborted) with this task.
async fn accept_loop(
    listener: TcpListener,
    agent: AgentClient,
    port: u16,
    sandbox: Weak<Sandbox>,
    sandbox_slots: Arc<Semaphore>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut relays = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = relays.join_next(), if !relays.is_empty() => continue,
        };
        let socket = match accepted {
            Ok((socket, _)) => socket,
            Err(e) => {
                tracing::warn!(port, error = %e, "an exposed port cannot accept");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Past either ceiling the connection is closed at once; the client may retry.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let Ok(sandbox_slot) = sandbox_slots.clone().try_acquire_owned() else {
            continue;
        };
        // Use of a preview is activity: the idle reaper leaves the sandbox alone.
        match sandbox.upgrade() {
            Some(sandbox) => sandbox.touch(),
            None => return,
        }
        let agent = agent.clone();
        relays.spawn(async move {
            relay(&agent, port, socket).await;
            drop((slot, sandbox_slot));
        });
    }
}

/// One host connection to the guest's port until either side is done with it.
async fn relay(agent: &AgentClient, port: u16, socket: TcpStream) {
    let _ = socket.set_nodelay(true);
    let (from_guest, to_guest) = match agent.tcp_connect(port, STREAM_WINDOW).await {
        Ok(stream) => stream,
        Err(e) => {
            // Nothing listens (yet): the client sees its connection closed.
            tracing::debug!(port, error = %e, "an exposed port's connection found no server");
            return;
        }
    };
    let (host_read, host_write) = socket.into_split();
    let down = down(from_guest, host_write);
    tokio::pin!(down);
    tokio::select! {
        up = up(host_read, &to_guest) => {
            // The client finished sending: the server's answer may still be coming.
            if up.is_ok() {
                (&mut down).await;
            }
        }
        () = &mut down => {}
    }
}

/// The host client's bytes to the guest; its end of file passed on as a half-close.
async fn up(mut host: tokio::net::tcp::OwnedReadHalf, guest: &TcpWriter) -> Result<(), AgentError> {
    let mut buf = vec![0u8; CHUNK_SIZE];
    loop {
        let n = match host.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => return Err(AgentError::ConnectionLost(e.to_string())),
        };
        if n == 0 {
            return guest.finish().await;
        }
        if !guest.send(&buf[..n]).await? {
            return Err(AgentError::ConnectionLost("the stream ended".into()));
        }
    }
}

/// The guest server's bytes to the host client, each acknowledged once written; ends when
/// the agent closes the stream (or the client stops taking bytes).
async fn down(mut guest: TcpReader, mut host: tokio::net::tcp::OwnedWriteHalf) {
    while let Some(event) = guest.recv().await {
        match event {
            TcpEvent::Data(data) => {
                if host.write_all(&data).await.is_err() {
                    return;
                }
                if guest.consumed(data.len()).await.is_err() {
                    return;
                }
            }
            TcpEvent::End => {
                let _ = host.shutdown().await;
            }
        }
    }
}

/// Request of both functions.
pub(crate) fn port_request() -> Value {
    object(
        &["sandbox_id", "port"],
        json!({
            "sandbox_id": uuid_schema(),
            "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "the port the server listens on inside the sandbox (any interface, its loopback included)"},
        }),
    )
}

pub(crate) fn expose_response() -> Value {
    object(
        &["url", "port", "host_port"],
        json!({
            "url": {"type": "string", "description": "http://<expose_address>:<host_port>, reached from the host"},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "host_port": {"type": "integer", "minimum": 1, "maximum": 65535},
        }),
    )
}

pub(crate) fn close_response() -> Value {
    object(&[], json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_outside_the_range_are_invalid_requests() {
        for bad in [
            json!(0),
            json!(70000),
            json!(-1),
            json!(80.5),
            json!("80"),
            json!(null),
        ] {
            let error = guest_port(&bad).unwrap_err();
            assert_eq!(error.code(), "S001", "{bad}");
        }
        assert_eq!(guest_port(&json!(1)).unwrap(), 1);
        assert_eq!(guest_port(&json!(65535)).unwrap(), 65535);
    }

    fn exposure(port: u16) -> Exposure {
        Exposure {
            url: format!("http://127.0.0.1:{port}"),
            host_port: port,
            accept: tokio::spawn(std::future::pending()),
        }
    }

    #[tokio::test]
    async fn the_ceiling_the_same_port_and_pausing_are_kept() {
        let exposures = Exposures::default();
        for port in 1..=MAX_EXPOSURES as u16 {
            assert!(exposures.insert(port, exposure(1000 + port)).is_ok());
        }
        // The same port again answers the first URL.
        let again = exposures.insert(1, exposure(5000)).ok().unwrap();
        assert_eq!(again, ("http://127.0.0.1:1001".to_string(), 1001));
        assert!(matches!(
            exposures.insert(99, exposure(5001)),
            Err(Refusal::Full)
        ));
        exposures.suspend();
        assert_eq!(exposures.listing(), json!([]));
        assert!(matches!(
            exposures.insert(2, exposure(5002)),
            Err(Refusal::Closed { paused: true })
        ));
        exposures.allow();
        assert!(exposures.insert(2, exposure(5003)).is_ok());
        exposures.shut();
        exposures.allow();
        assert!(matches!(
            exposures.insert(3, exposure(5004)),
            Err(Refusal::Closed { paused: false })
        ));
    }

    #[tokio::test]
    async fn closing_aborts_the_listener_task() {
        let exposures = Exposures::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host_port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            let _listener = listener;
            std::future::pending::<()>().await
        });
        let url = format!("http://127.0.0.1:{host_port}");
        let kept = Exposure {
            url,
            host_port,
            accept,
        };
        exposures.insert(8000, kept).ok().unwrap();
        assert!(TcpStream::connect(("127.0.0.1", host_port)).await.is_ok());
        drop(exposures.remove(8000));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            if TcpStream::connect(("127.0.0.1", host_port)).await.is_err() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "still accepting");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
