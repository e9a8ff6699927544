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

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::network::{DnsSetup, ALLOW_V4, ALLOW_V6, DENY_V4, DENY_V6, SET_SIZE, TABLE};
use crate::policy::{Egress, Targets};

/// The largest query taken from the sandbox (a question is a few dozen bytes).
pub const MAX_QUERY: usize = 4096;
/// A name's addresses stay in a set for the answer's TTL, within these bounds.
pub const MIN_TIMEOUT_SECS: u32 = 30;
pub const MAX_TIMEOUT_SECS: u32 = 3600;
/// Sockets to each resolver (the answers' ids are spread over them), and the payload asked
/// for a query that came over tcp.
const UPSTREAM_SOCKETS: usize = 4;
const UPSTREAM_PAYLOAD: u16 = 4096;
/// How long one resolver gets, and all of them together.
const UPSTREAM_TRY: Duration = Duration::from_secs(2);
const UPSTREAM_ALL: Duration = Duration::from_secs(5);
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
/// CNAME links followed from the question's name, and addresses taken from one answer.
const MAX_CHAIN: usize = 16;
const MAX_ADDRESSES: usize = 64;
/// A set element whose timeout is this close to what an answer asks is left as it is.
const REFRESH_SLACK: Duration = Duration::from_secs(5);
/// Errors written to the sandbox log at most (a guest must not fill it).
const MAX_LOGGED: u32 = 20;

/// What the proxy serves on: sockets of the sandbox's namespace, made by the launcher.
pub struct Listeners {
    pub udp: Vec<std::net::UdpSocket>,
    pub tcp: Vec<std::net::TcpListener>,
}

/// Udp sockets connected to one resolver.
pub struct Upstream {
    pub addr: SocketAddr,
    pub sockets: Vec<std::net::UdpSocket>,
}

/// Sockets to each of `addrs`, in this process's network namespace (a resolver that cannot
/// be reached from here is left out).
pub fn open_upstreams(addrs: &[SocketAddr]) -> Vec<Upstream> {
    addrs
        .iter()
        .filter_map(|addr| {
            let local: SocketAddr = if addr.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let sockets: Vec<std::net::UdpSocket> = (0..UPSTREAM_SOCKETS)
                .filter_map(|_| {
                    let socket = std::net::UdpSocket::bind(local).ok()?;
                    socket.connect(addr).ok()?;
                    Some(socket)
                })
                .collect();
            (!sockets.is_empty()).then_some(Upstream {
                addr: *addr,
                sockets,
            })
        })
        .collect()
}

/// Serves DNS until the process is killed (it dies with its sandbox), asking `upstreams`;
/// `nft` updates the sets of this process's network namespace (the sandbox's).
pub fn serve(
    listeners: Listeners,
    upstreams: Vec<Upstream>,
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
            let mut sockets = Vec::new();
            for socket in upstream.sockets {
                let socket = socket
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::UdpSocket::from_std(socket));
                match socket {
                    Ok(socket) => sockets.push(Arc::new(socket)),
                    Err(e) => return format!("cannot ask the resolver {}: {e}", upstream.addr),
                }
            }
            let resolver = Arc::new(Resolver {
                sockets,
                waiting: Mutex::new(HashMap::new()),
            });
            for index in 0..resolver.sockets.len() {
                tokio::spawn(hear(resolver.clone(), index));
            }
            resolvers.push(resolver);
        }
        let state = Arc::new(State::new(&setup, resolvers, Sets::new(nft)));
        let mut tasks = Vec::new();
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

/// Decodes one message from `bytes` without letting a flaw of the decoder take the proxy
/// down.
fn decode(bytes: &[u8]) -> Option<Message> {
    std::panic::catch_unwind(|| Message::from_vec(bytes).ok())
        .ok()
        .flatten()
}

/// A standard query of one question, else `Err(Some(reply))` (an error to send back) or
/// `Err(None)` (nothing worth an answer: not DNS, or a response).
pub fn read_query(bytes: &[u8]) -> Result<Message, Option<Vec<u8>>> {
    if bytes.len() < 12 {
        return Err(None);
    }
    let query = decode(bytes).ok_or(None)?;
    if query.metadata.message_type != MessageType::Query {
        return Err(None);
    }
    if query.metadata.op_code != OpCode::Query {
        return Err(Some(error_reply(&query, ResponseCode::NotImp)));
    }
    if query.queries.len() != 1
        || !query.answers.is_empty()
        || !query.authorities.is_empty()
        || !query.additionals.is_empty()
        || query.signature.is_some()
    {
        return Err(Some(error_reply(&query, ResponseCode::FormErr)));
    }
    let question = &query.queries[0];
    if question.query_class != DNSClass::IN
        || matches!(question.query_type, RecordType::AXFR | RecordType::IXFR)
    {
        return Err(Some(error_reply(&query, ResponseCode::Refused)));
    }
    Ok(query)
}

/// The answer to a question for `localhost` (or a name under it): its loopback addresses,
/// given here as RFC 6761 asks of a resolver. An image without `/etc/hosts` (the runtime
/// usually provides one) still finds `localhost`, where a guest's `III_URL` points.
fn localhost_reply(query: &Message) -> Option<Vec<u8>> {
    let question = &query.queries[0];
    let name = plain(&question.name);
    if name != "localhost" && !name.ends_with(".localhost") {
        return None;
    }
    let mut reply = Message::error_msg(
        query.metadata.id,
        query.metadata.op_code,
        ResponseCode::NoError,
    );
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    reply.queries = vec![question.clone()];
    let address = match question.query_type {
        RecordType::A => Some(RData::A(Ipv4Addr::LOCALHOST.into())),
        RecordType::AAAA => Some(RData::AAAA(Ipv6Addr::LOCALHOST.into())),
        _ => None,
    };
    reply.answers.extend(
        address.map(|rdata| {
            hickory_proto::rr::Record::from_rdata(question.name.clone(), 86400, rdata)
        }),
    );
    reply.to_vec().ok()
}

/// An answer with `code` to `query` (its id, question and flags).
fn error_reply(query: &Message, code: ResponseCode) -> Vec<u8> {
    let mut reply = Message::error_msg(query.metadata.id, query.metadata.op_code, code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.queries = query.queries.iter().take(1).cloned().collect();
    reply.to_vec().unwrap_or_else(|_| {
        // A question that cannot be encoded again: the header alone.
        let mut bare = Message::error_msg(query.metadata.id, query.metadata.op_code, code);
        bare.metadata.recursion_available = true;
        bare.to_vec().unwrap_or_default()
    })
}

/// Answers `query`: forwarded, the sets updated for a name of the lists, the answer encoded
/// for the sandbox (SERVFAIL when anything on the way fails).
async fn answer(state: &State, query: Message, transport: Transport) -> Vec<u8> {
    let servfail = |state: &State, query: &Message, why: &str| {
        state.log(why);
        error_reply(query, ResponseCode::ServFail)
    };
    let Some(response) = forward(state, &query, transport).await else {
        return error_reply(&query, ResponseCode::ServFail);
    };
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

/// The sandbox's copy of `response`: its id, TTLs capped for a name of the lists (the sandbox
/// must not trust an address longer than the set does), cut to what it can take over udp.
fn encode_reply(
    mut response: Message,
    query: &Message,
    matched: bool,
    transport: Transport,
) -> Option<Vec<u8>> {
    response.metadata.id = query.metadata.id;
    if matched {
        for record in response
            .answers
            .iter_mut()
            .chain(response.authorities.iter_mut())
            .chain(response.additionals.iter_mut())
        {
            record.ttl = record.ttl.min(MAX_TIMEOUT_SECS);
        }
    }
    let bytes = response.to_vec().ok()?;
    if transport == Transport::Udp && bytes.len() > usize::from(query.max_payload()) {
        let mut cut = response.truncate();
        cut.metadata.id = query.metadata.id;
        return cut.to_vec().ok();
    }
    Some(bytes)
}

/// One resolver's sockets and the questions waiting for its answers, by (socket, id).
struct Resolver {
    sockets: Vec<Arc<tokio::net::UdpSocket>>,
    waiting: Mutex<Waiting>,
}

type Waiting = HashMap<(usize, u16), tokio::sync::oneshot::Sender<Message>>;

/// Hands each answer heard on socket `index` to the question waiting for its id.
async fn hear(resolver: Arc<Resolver>, index: usize) {
    let mut buffer = vec![0u8; 65535];
    loop {
        let Ok(length) = resolver.sockets[index].recv(&mut buffer).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Some(response) = decode(&buffer[..length]) else {
            continue;
        };
        let waiter = resolver
            .waiting
            .lock()
            .ok()
            .and_then(|mut w| w.remove(&(index, response.metadata.id)));
        if let Some(waiter) = waiter {
            let _ = waiter.send(response);
        }
    }
}

/// Takes a question's place out of the waiting list however its wait ends.
struct Place<'a> {
    resolver: &'a Resolver,
    key: (usize, u16),
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Ok(mut waiting) = self.resolver.waiting.lock() {
            waiting.remove(&self.key);
        }
    }
}

/// The response of the first resolver that gives a valid one within the time allowed.
async fn forward(state: &State, query: &Message, transport: Transport) -> Option<Message> {
    let deadline = tokio::time::Instant::now() + UPSTREAM_ALL;
    let mut ours = query.clone();
    if transport == Transport::Tcp {
        // Asked over udp for a client that can take a long answer.
        let mut edns = ours.edns.clone().unwrap_or_default();
        edns.set_max_payload(edns.max_payload().max(UPSTREAM_PAYLOAD));
        ours.set_edns(edns);
    }
    for resolver in &state.upstream {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if let Ok(Some(response)) =
            tokio::time::timeout(UPSTREAM_TRY.min(left), ask(resolver, &mut ours)).await
        {
            return Some(response);
        }
    }
    None
}

/// Asks `resolver` `ours` under a fresh id of its own.
async fn ask(resolver: &Resolver, ours: &mut Message) -> Option<Message> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let key = {
        let mut waiting = resolver.waiting.lock().ok()?;
        // Our id, not the sandbox's, random among those not waiting.
        let key = (0..8)
            .map(|_| {
                let id = Message::query().metadata.id;
                (usize::from(id) % resolver.sockets.len(), id)
            })
            .find(|key| !waiting.contains_key(key))?;
        waiting.insert(key, sender);
        key
    };
    let _place = Place { resolver, key };
    ours.metadata.id = key.1;
    let bytes = ours.to_vec().ok()?;
    resolver.sockets[key.0].send(&bytes).await.ok()?;
    let response = receiver.await.ok()?;
    answers(&response, ours).then_some(response)
}

/// `bytes` as the response to `ours` (same id, a response, the same question), if it is one.
pub fn read_response(bytes: &[u8], ours: &Message) -> Option<Message> {
    let response = decode(bytes)?;
    answers(&response, ours).then_some(response)
}

/// Whether `response` is the response to `ours`: same id, a response, the same question.
fn answers(response: &Message, ours: &Message) -> bool {
    let same_question = match (response.queries.as_slice(), ours.queries.first()) {
        ([theirs], Some(asked)) => {
            plain(&theirs.name) == plain(&asked.name)
                && theirs.query_type == asked.query_type
                && theirs.query_class == asked.query_class
        }
        _ => false,
    };
    response.metadata.id == ours.metadata.id
        && response.metadata.message_type == MessageType::Response
        && same_question
}

/// A name as the lists hold them: lowercase, no trailing dot.
pub fn plain(name: &Name) -> String {
    let text = name.to_lowercase().to_ascii();
    text.strip_suffix('.').unwrap_or(&text).to_string()
}

/// What an answer for a name of the lists puts in the sets.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Judged {
    /// The question's name is one of the lists' (its answer's TTLs get capped).
    pub any: bool,
    /// (set, address, timeout in seconds)
    pub elements: Vec<(&'static str, IpAddr, u32)>,
}

/// The set elements `response` (to a question for `name`) calls for under `policy`.
pub fn judge(policy: &Egress, name: &str, response: &Message) -> Judged {
    let (allow, deny) = (
        policy.allow.names_match(name),
        policy.deny.names_match(name),
    );
    let mut judged = Judged {
        any: allow || deny,
        elements: Vec::new(),
    };
    if !judged.any {
        return judged;
    }
    for (addr, ttl) in addresses(name, response) {
        let timeout = ttl.clamp(MIN_TIMEOUT_SECS, MAX_TIMEOUT_SECS);
        let (v4, v6) = (addr.is_ipv4(), addr.is_ipv6());
        if deny {
            judged
                .elements
                .push((if v4 { DENY_V4 } else { DENY_V6 }, addr, timeout));
        }
        if allow && !deny && policy.name_may_open(addr) && (v4 || v6) {
            judged
                .elements
                .push((if v4 { ALLOW_V4 } else { ALLOW_V6 }, addr, timeout));
        }
    }
    judged
}

/// The A and AAAA addresses `response` gives `name`, following its CNAME chain, with their
/// TTLs (a bounded number of each).
pub fn addresses(name: &str, response: &Message) -> Vec<(IpAddr, u32)> {
    let mut names = vec![name.to_string()];
    // A chain needs as many passes as it has links, whatever their order in the answer.
    for _ in 0..MAX_CHAIN {
        let mut grew = false;
        for record in &response.answers {
            if let RData::CNAME(target) = &record.data {
                let (owner, target) = (plain(&record.name), plain(&target.0));
                if names.contains(&owner) && !names.contains(&target) && names.len() <= MAX_CHAIN {
                    names.push(target);
                    grew = true;
                }
            }
        }
        if !grew {
            break;
        }
    }
    let mut out = Vec::new();
    for record in &response.answers {
        let addr = match &record.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(aaaa) => IpAddr::V6(aaaa.0),
            _ => continue,
        };
        if names.contains(&plain(&record.name)) && out.len() < MAX_ADDRESSES {
            out.push((addr, record.ttl));
        }
    }
    out
}

/// One `nft` transaction for some elements: its script, how long to wait before running it
/// (an element about to expire is added again once it has), and the elements it changes.
struct Plan {
    script: String,
    wait: Option<Duration>,
    changed: Vec<(&'static str, IpAddr, u32)>,
}

/// The sets of the sandbox's ruleset as this proxy filled them, and how to change them.
pub struct Sets {
    nft: String,
    /// (set, address) -> when the element expires: no earlier than the first, no later than
    /// the second instant (`nft` takes a while to commit).
    known: HashMap<(&'static str, IpAddr), (Instant, Instant)>,
}

impl Sets {
    pub fn new(nft: String) -> Self {
        Sets {
            nft,
            known: HashMap::new(),
        }
    }

    /// Puts `elements` in their sets with their timeouts (refreshing those already there),
    /// in one `nft` transaction.
    pub fn add(&mut self, elements: &[(&'static str, IpAddr, u32)]) -> Result<(), String> {
        let now = Instant::now();
        let plan = self.plan(elements, now)?;
        if plan.script.is_empty() {
            return Ok(());
        }
        if let Some(wait) = plan.wait {
            std::thread::sleep(wait);
        }
        let before = Instant::now();
        self.run(&plan.script)?;
        let after = Instant::now();
        // Only what the script changed: an element left alone keeps the expiry it had.
        for (set, addr, timeout) in plan.changed {
            let timeout = Duration::from_secs(u64::from(timeout));
            self.known
                .insert((set, addr), (before + timeout, after + timeout));
        }
        Ok(())
    }

    /// The `nft` script for `elements` at `now` (see [`Plan`]).
    fn plan(
        &mut self,
        elements: &[(&'static str, IpAddr, u32)],
        now: Instant,
    ) -> Result<Plan, String> {
        self.known.retain(|_, (_, latest)| *latest > now);
        // One element once, with the longest timeout asked (an answer may repeat a record).
        let mut wanted: Vec<(&'static str, IpAddr, u32)> = Vec::new();
        for &(set, addr, timeout) in elements {
            match wanted.iter_mut().find(|(s, a, _)| *s == set && *a == addr) {
                Some(seen) => seen.2 = seen.2.max(timeout),
                None => wanted.push((set, addr, timeout)),
            }
        }
        let mut plan = Plan {
            script: String::new(),
            wait: None,
            changed: Vec::new(),
        };
        for (set, addr, timeout) in wanted {
            let lasting = Duration::from_secs(u64::from(timeout));
            match self.known.get(&(set, addr)) {
                Some((earliest, _)) if *earliest + REFRESH_SLACK >= now + lasting => continue,
                // Surely there still: replaced in the same transaction.
                Some((earliest, _)) if *earliest > now + Duration::from_secs(1) => {
                    plan.script
                        .push_str(&format!("delete element {TABLE} {set} {{ {addr} }}\n"));
                }
                Some((_, latest)) => {
                    let until = latest.saturating_duration_since(now) + Duration::from_millis(50);
                    plan.wait = Some(plan.wait.map_or(until, |w: Duration| w.max(until)));
                }
                None => {
                    let in_set = self.known.keys().filter(|(s, _)| *s == set).count();
                    if in_set >= SET_SIZE {
                        return Err(format!("the set {set} is full ({SET_SIZE} addresses)"));
                    }
                }
            }
            plan.script.push_str(&format!(
                "add element {TABLE} {set} {{ {addr} timeout {timeout}s }}\n"
            ));
            plan.changed.push((set, addr, timeout));
        }
        Ok(plan)
    }

    /// Runs `nft -f -` with `script` (in this process's network namespace: the sandbox's).
    fn run(&self, script: &str) -> Result<(), String> {
        let mut command = Command::new(&self.nft);
        command
            .args(["-f", "-"])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.nft))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(script.as_bytes());
        }
        let mut errors = String::new();
        if let Some(stderr) = child.stderr.take() {
            let _ = stderr.take(4096).read_to_string(&mut errors);
        }
        let status = child
            .wait()
            .map_err(|e| format!("cannot wait for {}: {e}", self.nft))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} could not update the sets ({status}): {}",
                self.nft,
                errors.trim()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::Record;
    use std::str::FromStr;

    fn name(text: &str) -> Name {
        Name::from_str(text).unwrap()
    }

    fn question(text: &str, kind: RecordType) -> Message {
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(name(text), kind));
        query
    }

    fn response_to(query: &Message, answers: Vec<Record>) -> Message {
        let mut response = Message::response(query.metadata.id, OpCode::Query);
        response.queries = query.queries.clone();
        response.answers = answers;
        response
    }

    fn a(owner: &str, ip: &str, ttl: u32) -> Record {
        Record::from_rdata(name(owner), ttl, RData::A(A(ip.parse().unwrap())))
    }

    fn policy(allow: &[&str], deny: &[&str]) -> Egress {
        policy_of(&DnsSetup {
            upstream: Vec::new(),
            allow_names: allow.iter().map(|s| s.to_string()).collect(),
            deny_names: deny.iter().map(|s| s.to_string()).collect(),
            names_within_defaults: false,
        })
    }

    #[test]
    fn a_standard_query_passes_and_anything_else_is_answered_or_dropped() {
        let query = question("public.test.", RecordType::A);
        let bytes = query.to_vec().unwrap();
        assert_eq!(read_query(&bytes).unwrap().queries, query.queries);
        // EDNS (the OPT record a resolver with `options edns0` adds) is no extra record.
        let mut with_edns = query.clone();
        let mut edns = hickory_proto::op::Edns::new();
        edns.set_max_payload(1232);
        with_edns.set_edns(edns);
        let parsed = read_query(&with_edns.to_vec().unwrap()).unwrap();
        assert_eq!(parsed.max_payload(), 1232);
        // A response, or garbage: dropped.
        let response = response_to(&query, Vec::new()).to_vec().unwrap();
        assert_eq!(read_query(&response), Err(None));
        assert_eq!(read_query(&bytes[..5]), Err(None));
        // Two questions: FORMERR; a zone transfer: REFUSED; another opcode: NOTIMP.
        let mut two = query.clone();
        two.add_query(Query::query(name("b.test."), RecordType::A));
        let reply = read_query(&two.to_vec().unwrap()).unwrap_err().unwrap();
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(reply.metadata.id, query.metadata.id);
        let axfr = question("public.test.", RecordType::AXFR).to_vec().unwrap();
        let reply = Message::from_vec(&read_query(&axfr).unwrap_err().unwrap()).unwrap();
        assert_eq!(reply.metadata.response_code, ResponseCode::Refused);
        let mut update = query.clone();
        update.metadata.op_code = OpCode::Update;
        let reply = read_query(&update.to_vec().unwrap()).unwrap_err().unwrap();
        assert_eq!(
            Message::from_vec(&reply).unwrap().metadata.response_code,
            ResponseCode::NotImp
        );
    }

    #[test]
    fn localhost_is_the_loopback_without_asking_anyone() {
        for (text, kind, expected) in [
            ("localhost.", RecordType::A, Some("127.0.0.1")),
            ("LocalHost.", RecordType::AAAA, Some("::1")),
            ("a.localhost.", RecordType::A, Some("127.0.0.1")),
            ("localhost.", RecordType::MX, None),
        ] {
            let query = question(text, kind);
            let reply = Message::from_vec(&localhost_reply(&query).unwrap()).unwrap();
            assert_eq!(reply.metadata.id, query.metadata.id);
            assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
            let answers: Vec<String> = reply.answers.iter().map(|r| r.data.to_string()).collect();
            assert_eq!(answers, expected.into_iter().collect::<Vec<_>>(), "{text}");
        }
        assert!(localhost_reply(&question("notlocalhost.", RecordType::A)).is_none());
        assert!(localhost_reply(&question("localhost.test.", RecordType::A)).is_none());
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let query = question("public.test.", RecordType::A).to_vec().unwrap();
        let mut crafted: Vec<Vec<u8>> = vec![
            // A compression pointer to itself, and one past the end.
            [&query[..12], &[0xC0, 0x0C, 0, 1, 0, 1][..]].concat(),
            [&query[..12], &[0xC0, 0xFF, 0, 1, 0, 1][..]].concat(),
            // Counts far beyond the data.
            [&[0, 1, 1, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF][..]].concat(),
            // A label longer than the message.
            [&query[..12], &[63, b'a', b'b'][..]].concat(),
            vec![0; MAX_QUERY],
            vec![0xFF; MAX_QUERY],
        ];
        // Cheap deterministic noise, and every cut of a valid query with bytes flipped.
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        for length in 0..600 {
            let bytes = (0..length % 300)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            crafted.push(bytes);
        }
        for cut in 0..query.len() {
            for flip in 0..8 {
                let mut bytes = query[..cut].to_vec();
                if let Some(b) = bytes.get_mut(cut / 2) {
                    *b ^= 1 << flip;
                }
                crafted.push(bytes);
            }
        }
        let asked = question("public.test.", RecordType::A);
        for bytes in &crafted {
            let _ = read_query(bytes);
            let _ = read_response(bytes, &asked);
        }
    }

    #[test]
    fn a_response_must_answer_our_question_with_our_id() {
        let query = question("Public.TEST.", RecordType::A);
        let good = response_to(&query, vec![a("public.test.", "198.51.100.10", 60)]);
        assert!(read_response(&good.to_vec().unwrap(), &query).is_some());
        let mut wrong_id = good.clone();
        wrong_id.metadata.id = query.metadata.id.wrapping_add(1);
        assert!(read_response(&wrong_id.to_vec().unwrap(), &query).is_none());
        let other = response_to(&question("other.test.", RecordType::A), Vec::new());
        let mut other = other.clone();
        other.metadata.id = query.metadata.id;
        assert!(read_response(&other.to_vec().unwrap(), &query).is_none());
        assert!(read_response(&query.to_vec().unwrap(), &query).is_none());
    }

    #[test]
    fn addresses_follow_the_cname_chain_only() {
        let query = question("www.test.", RecordType::A);
        let response = response_to(
            &query,
            vec![
                // Out of order on purpose; a record for a name off the chain is ignored.
                a("edge.cdn.test.", "198.51.100.20", 30),
                Record::from_rdata(
                    name("www.test."),
                    300,
                    RData::CNAME(CNAME(name("edge.cdn.test."))),
                ),
                a("elsewhere.test.", "203.0.113.9", 30),
                Record::from_rdata(
                    name("edge.cdn.test."),
                    300,
                    RData::AAAA(AAAA("2001:db8::20".parse().unwrap())),
                ),
            ],
        );
        let found = addresses("www.test", &response);
        assert_eq!(
            found,
            [
                ("198.51.100.20".parse().unwrap(), 30),
                ("2001:db8::20".parse().unwrap(), 300)
            ]
        );
        // A loop of CNAMEs ends.
        let looped = response_to(
            &query,
            vec![
                Record::from_rdata(name("www.test."), 1, RData::CNAME(CNAME(name("b.test.")))),
                Record::from_rdata(name("b.test."), 1, RData::CNAME(CNAME(name("www.test.")))),
            ],
        );
        assert!(addresses("www.test", &looped).is_empty());
    }

    #[test]
    fn names_of_the_lists_fill_their_sets_with_bounded_timeouts() {
        let query = question("private.test.", RecordType::A);
        let response = response_to(
            &query,
            vec![
                a("private.test.", "10.199.0.10", 5),
                a("private.test.", "169.254.169.254", 99_999),
            ],
        );
        let judged = judge(&policy(&["private.test"], &[]), "private.test", &response);
        assert!(judged.any);
        // Metadata is never opened by a name; the timeout is bounded below.
        assert_eq!(
            judged.elements,
            [(ALLOW_V4, "10.199.0.10".parse().unwrap(), MIN_TIMEOUT_SECS)]
        );
        let judged = judge(
            &policy(&["private.test"], &["*.test"]),
            "private.test",
            &response,
        );
        assert_eq!(
            judged.elements,
            [
                (DENY_V4, "10.199.0.10".parse().unwrap(), MIN_TIMEOUT_SECS),
                (
                    DENY_V4,
                    "169.254.169.254".parse().unwrap(),
                    MAX_TIMEOUT_SECS
                )
            ]
        );
        assert_eq!(
            judge(&policy(&["other.test"], &[]), "private.test", &response),
            Judged::default()
        );
        let mut within = policy(&["private.test"], &[]);
        within.names_within_defaults = true;
        assert!(judge(&within, "private.test", &response)
            .elements
            .is_empty());
    }

    #[test]
    fn ttls_of_a_listed_name_are_capped_and_a_long_answer_is_cut_for_udp() {
        let query = question("public.test.", RecordType::A);
        let response = response_to(&query, vec![a("public.test.", "198.51.100.10", 86_400)]);
        let reply = encode_reply(response.clone(), &query, true, Transport::Udp).unwrap();
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!(reply.answers[0].ttl, MAX_TIMEOUT_SECS);
        let many: Vec<Record> = (0..60)
            .map(|i| a("public.test.", &format!("198.51.100.{i}"), 60))
            .collect();
        let big = response_to(&query, many);
        let cut = encode_reply(big.clone(), &query, false, Transport::Udp).unwrap();
        assert!(cut.len() <= 512);
        assert!(Message::from_vec(&cut).unwrap().metadata.truncation);
        let whole = encode_reply(big, &query, false, Transport::Tcp).unwrap();
        assert_eq!(Message::from_vec(&whole).unwrap().answers.len(), 60);
    }

    #[test]
    fn the_plan_adds_new_elements_refreshes_old_ones_and_bounds_the_set() {
        let mut sets = Sets::new("nft".into());
        let ip: IpAddr = "198.51.100.10".parse().unwrap();
        let now = Instant::now();
        let plan = sets
            .plan(&[(ALLOW_V4, ip, 60), (ALLOW_V4, ip, 90)], now)
            .unwrap();
        // Once, with the longer timeout.
        assert_eq!(
            plan.script,
            "add element inet iii_egress allow_names_v4 { 198.51.100.10 timeout 90s }\n"
        );
        assert_eq!(plan.wait, None);
        assert_eq!(plan.changed, [(ALLOW_V4, ip, 90)]);
        let sixty = Duration::from_secs(60);
        sets.known
            .insert((ALLOW_V4, ip), (now + sixty, now + sixty));
        // Asked again at once: nothing to do, nothing changed.
        let plan = sets.plan(&[(ALLOW_V4, ip, 60)], now).unwrap();
        assert_eq!(plan.script, "");
        assert!(plan.changed.is_empty());
        // Half-way: replaced in one transaction; the other element asked with it is new.
        let later = now + Duration::from_secs(30);
        let other: IpAddr = "198.51.100.11".parse().unwrap();
        let plan = sets
            .plan(&[(ALLOW_V4, ip, 60), (DENY_V4, other, 60)], later)
            .unwrap();
        assert!(plan.script.starts_with("delete element"), "{}", plan.script);
        assert_eq!(plan.wait, None);
        assert_eq!(plan.changed.len(), 2);
        // About to expire: added again once it has.
        let edge = now + Duration::from_millis(59_500);
        let plan = sets.plan(&[(ALLOW_V4, ip, 60)], edge).unwrap();
        assert!(plan.script.starts_with("add element"), "{}", plan.script);
        assert!(plan.wait.unwrap() <= Duration::from_millis(600));
        // A full set refuses another address.
        for i in 0..SET_SIZE {
            let other = IpAddr::V6(Ipv6Addr::from(i as u128 + 1));
            sets.known
                .insert((ALLOW_V6, other), (now + sixty, now + sixty));
        }
        let new: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(sets.plan(&[(ALLOW_V6, new, 60)], now).is_err());
    }

    /// A resolver on 127.0.0.1 (udp and tcp, one port) answering `public.test` and
    /// `allowed.test` with 198.51.100.10 (TTL 60), anything else with no records.
    fn upstream() -> SocketAddr {
        // The kernel's free udp port may be taken for tcp (CI saw AddrInUse): try another.
        let (udp, at, tcp) = (0..100)
            .find_map(|_| {
                let udp = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
                let at = udp.local_addr().ok()?;
                let tcp = std::net::TcpListener::bind(at).ok()?;
                Some((udp, at, tcp))
            })
            .expect("a port free for both udp and tcp");
        let respond = |bytes: &[u8]| -> Option<Vec<u8>> {
            let query = Message::from_vec(bytes).ok()?;
            let asked = plain(&query.queries.first()?.name);
            let answers = match asked.as_str() {
                "public.test" | "allowed.test" => {
                    vec![a(&format!("{asked}."), "198.51.100.10", 60)]
                }
                _ => Vec::new(),
            };
            response_to(&query, answers).to_vec().ok()
        };
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok((length, peer)) = udp.recv_from(&mut buffer) {
                if let Some(reply) = respond(&buffer[..length]) {
                    let _ = udp.send_to(&reply, peer);
                }
            }
        });
        std::thread::spawn(move || {
            for mut stream in tcp.incoming().flatten() {
                let mut length = [0u8; 2];
                if stream.read_exact(&mut length).is_err() {
                    continue;
                }
                let mut query = vec![0u8; usize::from(u16::from_be_bytes(length))];
                if stream.read_exact(&mut query).is_ok() {
                    if let Some(reply) = respond(&query) {
                        let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                        framed.extend(reply);
                        let _ = stream.write_all(&framed);
                    }
                }
            }
        });
        at
    }

    /// A proxy on 127.0.0.1 (udp and tcp, one port) asking `upstream`, with `nft` a script
    /// that sleeps a little, then appends what it was given to `log` (or fails if `fail`).
    fn proxy(upstream: SocketAddr, dir: &std::path::Path, fail: bool) -> SocketAddr {
        let nft = dir.join("nft");
        let log = dir.join("nft.log");
        let body = if fail {
            "#!/bin/sh\nexit 1\n".to_string()
        } else {
            format!("#!/bin/sh\nsleep 0.2\ncat >> {}\n", log.display())
        };
        std::fs::write(&nft, body).unwrap();
        std::fs::set_permissions(&nft, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // The kernel's free udp port may be taken for tcp (CI saw AddrInUse): try another.
        let (udp, at, tcp) = (0..100)
            .find_map(|_| {
                let udp = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
                let at = udp.local_addr().ok()?;
                let tcp = std::net::TcpListener::bind(at).ok()?;
                Some((udp, at, tcp))
            })
            .expect("a port free for both udp and tcp");
        let setup = DnsSetup {
            upstream: Vec::new(),
            allow_names: vec!["allowed.test".into()],
            deny_names: vec!["public.test".into()],
            names_within_defaults: false,
        };
        let nft = nft.display().to_string();
        std::thread::spawn(move || {
            serve(
                Listeners {
                    udp: vec![udp],
                    tcp: vec![tcp],
                },
                open_upstreams(&[upstream]),
                nft,
                setup,
            )
        });
        at
    }

    fn ask_udp_sync(proxy: SocketAddr, name_text: &str) -> Option<Message> {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let query = question(name_text, RecordType::A);
        socket.send_to(&query.to_vec().unwrap(), proxy).unwrap();
        let mut buffer = [0u8; 65535];
        let (length, _) = socket.recv_from(&mut buffer).ok()?;
        let reply = Message::from_vec(&buffer[..length]).ok()?;
        assert_eq!(reply.metadata.id, query.metadata.id);
        Some(reply)
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("dns-proxy-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_listed_names_answer_comes_only_once_the_sets_hold_it() {
        let dir = scratch("sets");
        let at = proxy(upstream(), &dir, false);
        let log = dir.join("nft.log");
        let reply = ask_udp_sync(at, "Public.Test.").expect("an answer");
        assert_eq!(reply.answers.len(), 1, "{reply:?}");
        // The script sleeps before it writes: the answer waited for it.
        let script = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            script.contains(
                "add element inet iii_egress deny_names_v4 { 198.51.100.10 timeout 60s }"
            ),
            "{script:?}"
        );
        // An allowed name fills the allow set; an unlisted one nothing.
        ask_udp_sync(at, "allowed.test.").expect("an answer");
        let unlisted = ask_udp_sync(at, "unlisted.test.").expect("an answer");
        assert!(unlisted.answers.is_empty());
        let script = std::fs::read_to_string(&log).unwrap();
        assert!(
            script.contains("allow_names_v4 { 198.51.100.10 timeout 60s }"),
            "{script}"
        );
        assert!(!script.contains("unlisted"), "{script}");
        // Over tcp too.
        let mut stream = std::net::TcpStream::connect(at).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let query = question("public.test.", RecordType::A).to_vec().unwrap();
        let mut framed = (query.len() as u16).to_be_bytes().to_vec();
        framed.extend(&query);
        stream.write_all(&framed).unwrap();
        let mut length = [0u8; 2];
        stream.read_exact(&mut length).unwrap();
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(length))];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(Message::from_vec(&reply).unwrap().answers.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sets_that_cannot_take_an_answer_make_it_servfail() {
        let dir = scratch("fail");
        let at = proxy(upstream(), &dir, true);
        let reply = ask_udp_sync(at, "public.test.").expect("an answer");
        assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
        assert!(reply.answers.is_empty());
        // A name of no list needs no set: answered.
        let reply = ask_udp_sync(at, "unlisted.test.").expect("an answer");
        assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_flood_is_dropped_a_burst_refused_and_the_proxy_answers_after() {
        let dir = scratch("flood");
        let at = proxy(upstream(), &dir, false);
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let valid = question("unlisted.test.", RecordType::A).to_vec().unwrap();
        let mut seed: u64 = 7;
        for i in 0..6000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut bytes = valid.clone();
            bytes.truncate((seed % 40) as usize);
            if i % 3 == 0 {
                bytes = vec![(seed >> 8) as u8; (seed % 5000) as usize];
            }
            let _ = socket.send_to(&bytes, at);
        }
        // Garbage over tcp: a zero length, a length past the cap, a stalled half message.
        for garbage in [&[0u8, 0][..], &[0xFF, 0xFF, 1, 2][..], &[0, 40, 1][..]] {
            if let Ok(mut stream) = std::net::TcpStream::connect(at) {
                let _ = stream.write_all(garbage);
            }
        }
        // A burst of valid queries: past the rate some are refused, none is lost for good.
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        std::thread::sleep(Duration::from_secs(3));
        for _ in 0..400 {
            let _ = socket.send_to(&valid, at);
        }
        let mut codes = HashMap::new();
        let mut buffer = [0u8; 4096];
        while let Ok((length, _)) = socket.recv_from(&mut buffer) {
            if let Ok(reply) = Message::from_vec(&buffer[..length]) {
                *codes.entry(reply.metadata.response_code).or_insert(0) += 1;
            }
        }
        assert!(
            codes.get(&ResponseCode::Refused).copied().unwrap_or(0) > 0,
            "{codes:?}"
        );
        assert!(
            codes.get(&ResponseCode::NoError).copied().unwrap_or(0) > 0,
            "{codes:?}"
        );
        // Once the rate allows it again: answered.
        std::thread::sleep(Duration::from_secs(3));
        let reply = ask_udp_sync(at, "public.test.").expect("answers after the flood");
        assert_eq!(reply.answers.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
