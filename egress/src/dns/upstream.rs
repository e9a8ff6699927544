//! Asking the resolvers: a few udp sockets to each, opened in the host's network namespace
//! before the proxy moves into the sandbox's; each question asked under an id of ours, its
//! answer taken only if it answers that question.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::Message;

use super::message::{answers, decode};
use super::Transport;

/// Sockets to each resolver (the answers' ids are spread over them), and the payload asked
/// for a query that came over tcp.
const UPSTREAM_SOCKETS: usize = 4;
const UPSTREAM_PAYLOAD: u16 = 4096;
/// How long one resolver gets, and all of them together.
const UPSTREAM_TRY: Duration = Duration::from_secs(2);
const UPSTREAM_ALL: Duration = Duration::from_secs(5);

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

/// One resolver's sockets and the questions waiting for its answers, by (socket, id).
pub(super) struct Resolver {
    sockets: Vec<Arc<tokio::net::UdpSocket>>,
    waiting: Mutex<Waiting>,
}

type Waiting = HashMap<(usize, u16), tokio::sync::oneshot::Sender<Message>>;

impl Resolver {
    /// Serves `upstream`'s sockets: a listener a socket hands each answer to its question.
    pub(super) fn start(upstream: Upstream) -> Result<Arc<Resolver>, String> {
        let mut sockets = Vec::new();
        for socket in upstream.sockets {
            let socket = socket
                .set_nonblocking(true)
                .and_then(|()| tokio::net::UdpSocket::from_std(socket));
            match socket {
                Ok(socket) => sockets.push(Arc::new(socket)),
                Err(e) => return Err(format!("cannot ask the resolver {}: {e}", upstream.addr)),
            }
        }
        let resolver = Arc::new(Resolver {
            sockets,
            waiting: Mutex::new(HashMap::new()),
        });
        for index in 0..resolver.sockets.len() {
            tokio::spawn(hear(resolver.clone(), index));
        }
        Ok(resolver)
    }
}

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
pub(super) async fn forward(
    resolvers: &[Arc<Resolver>],
    query: &Message,
    transport: Transport,
) -> Option<Message> {
    let deadline = tokio::time::Instant::now() + UPSTREAM_ALL;
    let mut ours = query.clone();
    if transport == Transport::Tcp {
        // Asked over udp for a client that can take a long answer.
        let mut edns = ours.edns.clone().unwrap_or_default();
        edns.set_max_payload(edns.max_payload().max(UPSTREAM_PAYLOAD));
        ours.set_edns(edns);
    }
    for resolver in resolvers {
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
