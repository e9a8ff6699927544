//! The sandbox's resolver proxy (see `network.rs`): every DNS query the sandbox sends reaches
//! it through the redirect in the sandbox's ruleset. It asks the host's resolvers (or
//! `network_dns`), and for a name in `network_allow` or `network_deny` puts the answered
//! A/AAAA addresses in the ruleset's sets, with the answer's TTL (bounded) as their timeout,
//! before the sandbox sees the answer: the first connection after a resolution is already
//! judged.
//!
//! It runs in a process of its own that the launcher forks (`netns.rs`), in the sandbox's user
//! namespace (whose root owns the sandbox's network namespace: CAP_NET_ADMIN there for `nft`)
//! and the launcher's pid namespace, which sandbox code cannot see: it can neither signal nor
//! trace it. Its only way out is a few udp sockets connected to the resolvers, opened in the
//! host's network namespace before it moved into the sandbox's: its traffic to them is not the
//! sandbox's policy's to judge, and a proxy taken over by hostile input could reach nothing
//! else of the host. Queries from the sandbox over tcp are answered too, asked upstream over
//! udp with room for 4096 bytes (a longer answer stays truncated). Everything it reads from the
//! sandbox is hostile: bounded sizes, rate limits, a bounded number of queries in flight and of
//! TCP connections, and every message parsed by `hickory-proto`, never by hand.
//!
//! One concern a module: [`message`] reads the sandbox's queries and writes the answers it
//! gets, [`upstream`] asks the resolvers, [`judge`] picks the addresses an answer puts in the
//! ruleset's sets, and [`sets`] puts them there with `nft`; this module serves the sockets
//! within the bounds below.

mod judge;
mod message;
mod sets;
mod upstream;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::host_watch::HostWatch;
use crate::network::DnsSetup;
use crate::policy::{Egress, Targets};

pub use judge::{addresses, judge, Judged};
use message::{answer_names_ok, encode_reply, error_reply, localhost_reply};
pub use message::{plain, read_query, read_response};
pub(crate) use sets::run_nft;
pub use sets::Sets;
use upstream::{forward, Resolver};
pub use upstream::{open_upstreams, Upstream};

/// The largest query taken from the sandbox (a question is a few dozen bytes).
pub const MAX_QUERY: usize = 4096;
/// A name's addresses stay in a set for the answer's TTL, within these bounds.
pub const MIN_TIMEOUT_SECS: u32 = 30;
pub const MAX_TIMEOUT_SECS: u32 = 3600;
/// Queries being answered at once; past it a query is refused.
const MAX_IN_FLIGHT: usize = 64;
/// Queries forwarded per second (a burst of twice that); past it refused.
const QUERIES_PER_SEC: f64 = 100.0;
/// Packets (and TCP messages) read per second, well formed or not; past it dropped unread.
const PACKETS_PER_SEC: f64 = 2000.0;
/// TCP connections at once, how long one may stay silent, and how many queries it carries.
const MAX_TCP: usize = 16;
const TCP_IDLE: Duration = Duration::from_secs(10);
const TCP_QUERIES: usize = 64;
/// Errors written to the sandbox log at most (a guest must not fill it).
const MAX_LOGGED: u32 = 20;

/// What the proxy serves on: sockets of the sandbox's namespace, made by the launcher.
pub struct Listeners {
    pub udp: Vec<std::net::UdpSocket>,
    pub tcp: Vec<std::net::TcpListener>,
}

/// Whether the proxy must also listen on an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V6 {
    /// The namespace has IPv6: failing to listen there fails the set-up.
    Required(std::net::Ipv6Addr),
    /// Where the namespace has IPv6 (a failure leaves the proxy on IPv4 alone).
    IfAvailable(std::net::Ipv6Addr),
    None,
}

impl Listeners {
    /// The proxy's udp and tcp sockets on `v4` and, as `v6` says, an IPv6 address, all on
    /// [`crate::network::DNS_PROXY_PORT`].
    pub fn bind(v4: std::net::Ipv4Addr, v6: V6) -> Result<Listeners, String> {
        use std::net::{TcpListener, UdpSocket};
        let port = crate::network::DNS_PROXY_PORT;
        let bound = |e: std::io::Error| format!("cannot listen for the sandbox's DNS: {e}");
        let mut listeners = Listeners {
            udp: vec![UdpSocket::bind((v4, port)).map_err(bound)?],
            tcp: vec![TcpListener::bind((v4, port)).map_err(bound)?],
        };
        let pair = |address| -> std::io::Result<(UdpSocket, TcpListener)> {
            Ok((
                UdpSocket::bind((address, port))?,
                TcpListener::bind((address, port))?,
            ))
        };
        let v6 = match v6 {
            V6::Required(address) => Some(pair(address).map_err(bound)?),
            V6::IfAvailable(address) => pair(address).ok(),
            V6::None => None,
        };
        if let Some((udp, tcp)) = v6 {
            listeners.udp.push(udp);
            listeners.tcp.push(tcp);
        }
        Ok(listeners)
    }
}

/// Serves DNS until the process is killed (it dies with its sandbox), asking `upstreams`;
/// `nft` updates the sets of this process's network namespace (the sandbox's), the host's
/// from what `watch` hears of the host's addresses (see `host_watch.rs`).
pub fn serve(
    listeners: Listeners,
    upstreams: Vec<Upstream>,
    watch: Option<HostWatch>,
    nft: String,
    setup: DnsSetup,
) -> String {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return format!("cannot start the resolver proxy: {e}"),
    };
    runtime.block_on(async move {
        let mut resolvers = Vec::new();
        for upstream in upstreams {
            match Resolver::start(upstream) {
                Ok(resolver) => resolvers.push(resolver),
                Err(e) => return e,
            }
        }
        let state = Arc::new(State::new(&setup, resolvers, Sets::new(nft.clone())));
        let mut tasks = Vec::new();
        if let Some(watch) = watch {
            let state = state.clone();
            tasks.push(tokio::spawn(async move {
                crate::host_watch::follow(watch, nft, |what| state.log(what)).await;
            }));
        }
        for socket in listeners.udp {
            let socket = socket
                .set_nonblocking(true)
                .and_then(|()| tokio::net::UdpSocket::from_std(socket));
            match socket {
                Ok(socket) => tasks.push(tokio::spawn(serve_udp(Arc::new(socket), state.clone()))),
                Err(e) => return format!("cannot serve DNS over udp: {e}"),
            }
        }
        for listener in listeners.tcp {
            let listener = listener
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(listener));
            match listener {
                Ok(listener) => tasks.push(tokio::spawn(serve_tcp(listener, state.clone()))),
                Err(e) => return format!("cannot serve DNS over tcp: {e}"),
            }
        }
        for task in tasks {
            let _ = task.await;
        }
        "the resolver proxy stopped".into()
    })
}

/// The proxy's shared state.
struct State {
    /// The names and what they may open (only `allow.names`, `deny.names` and
    /// `names_within_defaults` are used).
    policy: Egress,
    upstream: Vec<Arc<Resolver>>,
    sets: Arc<Mutex<Sets>>,
    queries: Mutex<Bucket>,
    packets: Mutex<Bucket>,
    in_flight: Arc<Semaphore>,
    tcp_slots: Arc<Semaphore>,
    logged: AtomicU32,
}

impl State {
    fn new(setup: &DnsSetup, upstream: Vec<Arc<Resolver>>, sets: Sets) -> Self {
        State {
            policy: policy_of(setup),
            upstream,
            sets: Arc::new(Mutex::new(sets)),
            queries: Mutex::new(Bucket::new(QUERIES_PER_SEC)),
            packets: Mutex::new(Bucket::new(PACKETS_PER_SEC)),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            tcp_slots: Arc::new(Semaphore::new(MAX_TCP)),
            logged: AtomicU32::new(0),
        }
    }

    fn log(&self, what: &str) {
        if self.logged.fetch_add(1, Ordering::Relaxed) < MAX_LOGGED {
            eprintln!("{}: dns: {what}", crate::program());
        }
    }

    fn take(bucket: &Mutex<Bucket>) -> bool {
        bucket
            .lock()
            .map(|mut b| b.take(Instant::now()))
            .unwrap_or(false)
    }
}

fn policy_of(setup: &DnsSetup) -> Egress {
    Egress {
        allow: Targets {
            nets: Vec::new(),
            names: setup.allow_names.clone(),
        },
        deny: Targets {
            nets: Vec::new(),
            names: setup.deny_names.clone(),
        },
        names_within_defaults: setup.names_within_defaults,
        ..Egress::default()
    }
}

/// A token bucket: `rate` a second, bursts of twice that.
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        Bucket {
            rate,
            tokens: 2.0 * rate,
            at: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(2.0 * self.rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

async fn serve_udp(socket: Arc<tokio::net::UdpSocket>, state: Arc<State>) {
    // One byte more than a query may hold: a longer datagram is cut to it and dropped.
    let mut buffer = vec![0u8; MAX_QUERY + 1];
    loop {
        let (length, peer) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if length > MAX_QUERY || !State::take(&state.packets) {
            continue;
        }
        let Some(job) = admit(&state, &buffer[..length]) else {
            continue;
        };
        match job {
            Admitted::Reply(reply) => {
                let _ = socket.send_to(&reply, peer).await;
            }
            Admitted::Forward(query, permit) => {
                let (socket, state) = (socket.clone(), state.clone());
                tokio::spawn(async move {
                    let reply = answer(&state, query, Transport::Udp).await;
                    drop(permit);
                    let _ = socket.send_to(&reply, peer).await;
                });
            }
        }
    }
}

async fn serve_tcp(listener: tokio::net::TcpListener, state: Arc<State>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(slot) = state.tcp_slots.clone().try_acquire_owned() else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _ = serve_tcp_connection(stream, &state).await;
        });
    }
}

async fn serve_tcp_connection(
    mut stream: tokio::net::TcpStream,
    state: &State,
) -> std::io::Result<()> {
    let timeout = |what: &'static str| std::io::Error::new(std::io::ErrorKind::TimedOut, what);
    for _ in 0..TCP_QUERIES {
        let length = tokio::time::timeout(TCP_IDLE, stream.read_u16())
            .await
            .map_err(|_| timeout("idle"))?? as usize;
        if length == 0 || length > MAX_QUERY || !State::take(&state.packets) {
            return Ok(());
        }
        let mut query = vec![0u8; length];
        tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut query))
            .await
            .map_err(|_| timeout("slow query"))??;
        let reply = match admit(state, &query) {
            None => return Ok(()),
            Some(Admitted::Reply(reply)) => reply,
            Some(Admitted::Forward(query, permit)) => {
                let reply = answer(state, query, Transport::Tcp).await;
                drop(permit);
                reply
            }
        };
        let Ok(length) = u16::try_from(reply.len()) else {
            return Ok(());
        };
        let mut framed = length.to_be_bytes().to_vec();
        framed.extend_from_slice(&reply);
        tokio::time::timeout(TCP_IDLE, stream.write_all(&framed))
            .await
            .map_err(|_| timeout("slow reader"))??;
    }
    Ok(())
}

enum Admitted {
    /// Answered without asking anyone (refused, malformed).
    Reply(Vec<u8>),
    /// To forward, holding a place among the queries in flight.
    Forward(Message, tokio::sync::OwnedSemaphorePermit),
}

/// What to do with `bytes` from the sandbox; `None`: drop it unanswered.
fn admit(state: &State, bytes: &[u8]) -> Option<Admitted> {
    let query = match read_query(bytes) {
        Ok(query) => query,
        Err(Some(reply)) => return Some(Admitted::Reply(reply)),
        Err(None) => return None,
    };
    if let Some(reply) = localhost_reply(&query) {
        return Some(Admitted::Reply(reply));
    }
    if !State::take(&state.queries) {
        return Some(Admitted::Reply(error_reply(&query, ResponseCode::Refused)));
    }
    match state.in_flight.clone().try_acquire_owned() {
        Ok(permit) => Some(Admitted::Forward(query, permit)),
        Err(_) => Some(Admitted::Reply(error_reply(&query, ResponseCode::Refused))),
    }
}

/// Answers `query`: forwarded, the sets updated for a name of the lists, the answer encoded
/// for the sandbox (SERVFAIL when anything on the way fails).
async fn answer(state: &State, query: Message, transport: Transport) -> Vec<u8> {
    let servfail = |state: &State, query: &Message, why: &str| {
        state.log(why);
        error_reply(query, ResponseCode::ServFail)
    };
    let Some(response) = forward(&state.upstream, &query, transport).await else {
        return error_reply(&query, ResponseCode::ServFail);
    };
    // An answer naming what its text would misread is refused, as such a question is.
    if !answer_names_ok(&response) {
        state.log("refused an answer whose names hold labels no host name can");
        return error_reply(&query, ResponseCode::Refused);
    }
    let name = plain(&query.queries[0].name);
    let matched = judge(&state.policy, &name, &response);
    if !matched.elements.is_empty() {
        let sets = state.sets.clone();
        let elements = matched.elements.clone();
        let applied = tokio::task::spawn_blocking(move || match sets.lock() {
            Ok(mut sets) => sets.add(&elements),
            Err(_) => Err("the sets' state is poisoned".into()),
        })
        .await;
        match applied {
            Ok(Ok(())) => {}
            // The answer is only ever given once the sets hold it.
            Ok(Err(e)) => return servfail(state, &query, &e),
            Err(e) => return servfail(state, &query, &e.to_string()),
        }
    }
    match encode_reply(response, &query, matched.any, transport) {
        Some(reply) => reply,
        None => servfail(state, &query, "cannot encode an answer"),
    }
}

#[cfg(test)]
mod tests;
