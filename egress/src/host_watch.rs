//! The host's own addresses, followed for as long as a sandbox runs.
//!
//! No sandbox may reach the host's services through one of the host's addresses (an engine or
//! any other service listening on 0.0.0.0 answers on all of them). The ruleset refuses what
//! its sets [`HOST_V4`] and [`HOST_V6`] hold, and those addresses change while sandboxes run: a
//! DHCP or SLAAC renewal, a VPN coming up, a cloud's secondary address, an operator's
//! `ip addr add`. A set filled once would let a sandbox reach an address the host gained
//! later. So the sandbox's resolver proxy (a process of its own, in the ruleset's namespace,
//! with CAP_NET_ADMIN there for `nft`) also holds an rtnetlink socket it opened in the host's
//! network namespace, subscribed to the host's address changes (`RTM_NEWADDR`,
//! `RTM_DELADDR`) and its routes of type `local` (`RTM_NEWROUTE`, `RTM_DELROUTE`: an AnyIP
//! route such as `ip route add local 198.51.100.0/24 dev lo` makes the host answer on every
//! address of the prefix, none of which is an interface's address), and rewrites both sets
//! after every change in one `nft` transaction (the sets are never seen empty or
//! half-written). A socket belongs to the namespace it was
//! opened in: it keeps hearing the host after the proxy moved into the sandbox's.
//!
//! The kernel lets any user receive rtnetlink's address notifications and dump the
//! addresses (as `ip monitor` does): the proxy needs no privilege of the host's for it.
//!
//! The subscription comes first, then a dump of every address and then of every route:
//! nothing that changes in between is missed. Notifications the socket had no room for (`ENOBUFS`) make it dump
//! again. If the socket fails for good, the sets are made to hold every address (the
//! sandbox loses its network rather than be let at the host's).
//!
//! Idle it costs one socket and one task blocked on it; a change costs a `nft` run (a few
//! milliseconds, see `tests/e2e/tests/host_addresses.rs` for the measured bound).
//!
//! [`HOST_V4`]: crate::network::HOST_V4
//! [`HOST_V6`]: crate::network::HOST_V6

// tokio's readiness of a descriptor it does not own (the netlink socket) is an unsafe
// registration.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::route::{RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use tokio::io::unix::AsyncFd;

use crate::network::host_sets_script;

/// rtnetlink's multicast groups of the IPv4 and IPv6 address and route changes (`RTNLGRP_*`).
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;
/// The largest datagram read at once (the kernel's dump fills at most a page or two).
const RECEIVE_BUFFER: usize = 64 * 1024;
/// How long after a failed `nft` run the sets are written again.
const RETRY: Duration = Duration::from_secs(1);
/// Dumps refused in a row before the socket counts as failed for good.
const MAX_REFUSED_DUMPS: u32 = 8;

/// A socket of the host's network namespace, subscribed to its address changes. Open it while
/// still in the host's namespace.
pub struct HostWatch {
    socket: Socket,
}

impl HostWatch {
    pub fn open() -> io::Result<HostWatch> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind(&SocketAddr::new(0, 0))?;
        for group in [
            RTNLGRP_IPV4_IFADDR,
            RTNLGRP_IPV6_IFADDR,
            RTNLGRP_IPV4_ROUTE,
            RTNLGRP_IPV6_ROUTE,
        ] {
            socket.add_membership(group)?;
        }
        socket.set_non_blocking(true)?;
        Ok(HostWatch { socket })
    }

    /// Asks for every address or every route of the host (answered on the same socket, among
    /// the changes; one dump at a time).
    fn request_dump(&self, dump: Dump) -> io::Result<()> {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let request = match dump {
            Dump::Addresses => RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            Dump::Routes => RouteNetlinkMessage::GetRoute(RouteMessage::default()),
        };
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        self.socket.send_to(&out, &SocketAddr::new(0, 0), 0)?;
        Ok(())
    }
}

/// What one dump lists: the host's addresses first, then its routes (the addresses' dump
/// must end before the kernel takes the next).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dump {
    Addresses,
    Routes,
}

/// The host's addresses as the messages read so far describe them.
#[derive(Debug, Default)]
pub(crate) struct Addresses {
    /// (interface index, address): one address may be on two interfaces, and stays the
    /// host's until it is on none.
    known: BTreeSet<(u32, IpAddr)>,
    /// (table, prefix) of each route of type `local`: the host answers on every address of
    /// the prefix.
    local_routes: BTreeSet<(u32, IpNet)>,
    /// The dump being answered: the sets wait for both to end (a partial list would release
    /// addresses the host still has).
    dumping: Option<Dump>,
    /// Notifications were lost while a dump was under way: dump again once it ends.
    lost: bool,
    /// Dumps the kernel refused in a row.
    refused: u32,
}

/// What [`Addresses::read`] asks of its caller next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    Nothing,
    /// Notifications were lost: ask for a dump of the addresses (the routes' follows).
    Dump,
    /// The addresses' dump ended: ask for the routes'.
    DumpRoutes,
}

impl Addresses {
    /// The host's addresses and its local routes' prefixes, each once.
    pub(crate) fn current(&self) -> BTreeSet<IpNet> {
        self.known
            .iter()
            .map(|(_, addr)| IpNet::from(*addr))
            .chain(self.local_routes.iter().map(|(_, net)| *net))
            .collect()
    }

    /// Whether the sets may be written from [`Self::current`] (no dump half-read).
    pub(crate) fn settled(&self) -> bool {
        self.dumping.is_none()
    }

    /// A dump was asked for: what it lists replaces what is known of its kind.
    pub(crate) fn dump_started(&mut self, dump: Dump) {
        match dump {
            Dump::Addresses => {
                self.known.clear();
                self.lost = false;
            }
            Dump::Routes => self.local_routes.clear(),
        }
        self.dumping = Some(dump);
    }

    /// The socket had no room for some notifications.
    pub(crate) fn overrun(&mut self) -> Next {
        if self.dumping.is_some() {
            self.lost = true;
            Next::Nothing
        } else {
            Next::Dump
        }
    }

    /// Takes in one datagram's messages.
    pub(crate) fn read(&mut self, mut bytes: &[u8]) -> Next {
        let mut next = Next::Nothing;
        while !bytes.is_empty() {
            let Ok(message) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) else {
                // Not one we can read: the rest of the datagram with it. A notification
                // missed this way is as good as lost.
                return self.overrun();
            };
            // Messages in one datagram start on 4-byte boundaries.
            let length = (message.header.length as usize).next_multiple_of(4);
            bytes = &bytes[length.clamp(1, bytes.len())..];
            match message.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(address)) => {
                    if let Some(entry) = entry(&address) {
                        self.known.insert(entry);
                    }
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(address)) => {
                    if let Some(entry) = entry(&address) {
                        self.known.remove(&entry);
                    }
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(route)) => {
                    if let Some(entry) = local_route(&route) {
                        self.local_routes.insert(entry);
                    }
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(route)) => {
                    if let Some(entry) = local_route(&route) {
                        self.local_routes.remove(&entry);
                    }
                }
                NetlinkPayload::Done(_) => {
                    self.refused = 0;
                    if std::mem::take(&mut self.lost) {
                        self.dumping = None;
                        next = Next::Dump;
                    } else if self.dumping == Some(Dump::Addresses) {
                        next = Next::DumpRoutes;
                    } else {
                        self.dumping = None;
                    }
                }
                NetlinkPayload::Overrun(_) => next = self.overrun(),
                NetlinkPayload::Error(error) if error.code.is_some() => {
                    // The dump was refused: ask again rather than keep a partial list.
                    self.dumping = None;
                    self.refused += 1;
                    next = Next::Dump;
                }
                _ => {}
            }
        }
        next
    }
}

/// The interface and the host's own address an address message names: its `IFA_LOCAL`, else
/// its `IFA_ADDRESS` (on a point-to-point link the latter is the peer's), as `getifaddrs`
/// reads them.
fn entry(message: &AddressMessage) -> Option<(u32, IpAddr)> {
    let mut local = None;
    let mut address = None;
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            _ => {}
        }
    }
    Some((message.header.index, local.or(address)?))
}

/// The table and prefix of a route of type `local` (the local table holds one per address
/// of the host, and an AnyIP route's whole prefix); `None` for any other route.
fn local_route(message: &RouteMessage) -> Option<(u32, IpNet)> {
    if message.header.kind != RouteType::Local {
        return None;
    }
    let table = message
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            RouteAttribute::Table(table) => Some(*table),
            _ => None,
        })
        .unwrap_or(u32::from(message.header.table));
    Some((table, crate::rtnetlink::destination(message)?))
}

/// Follows the host's addresses with `watch` until the process ends, writing them into this
/// process's namespace's host sets with `nft`; `log` says what went wrong.
pub async fn follow(watch: HostWatch, nft: String, log: impl Fn(&str)) {
    // SAFETY: the descriptor is the socket `watch` owns, which the AsyncFd owns in turn: it
    // stays open, and the same, until the AsyncFd is dropped.
    let watch = match unsafe { AsyncFd::register(watch) } {
        Ok(watch) => watch,
        Err(e) => return give_up(&nft, &log, &format!("cannot wait on the socket: {e}")).await,
    };
    let mut addresses = Addresses::default();
    let mut written: Option<BTreeSet<IpNet>> = None;
    let mut failed_write = false;
    let mut dump = Some(Dump::Addresses);
    let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
    loop {
        if let Some(kind) = dump.take() {
            if addresses.refused >= MAX_REFUSED_DUMPS {
                return give_up(&nft, &log, "the kernel refuses to list them").await;
            }
            if let Err(e) = watch.get_ref().request_dump(kind) {
                return give_up(&nft, &log, &format!("cannot list them: {e}")).await;
            }
            addresses.dump_started(kind);
        }
        // Everything queued is read before the sets are written: a burst of changes costs
        // one `nft` run. A full dump asked for wins over the routes' half of one.
        let want = |next: Next, dump: &mut Option<Dump>| match next {
            Next::Dump => *dump = Some(Dump::Addresses),
            Next::DumpRoutes if dump.is_none() => *dump = Some(Dump::Routes),
            _ => {}
        };
        loop {
            buffer.clear();
            match watch.get_ref().socket.recv(&mut buffer, 0) {
                Ok(_) => want(addresses.read(&buffer), &mut dump),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    want(addresses.overrun(), &mut dump);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return give_up(&nft, &log, &format!("cannot read them: {e}")).await,
            }
        }
        if dump.is_some() {
            continue;
        }
        if addresses.settled() {
            let current = addresses.current();
            if written.as_ref() != Some(&current) {
                match write_sets(&nft, &current).await {
                    Ok(()) => {
                        written = Some(current);
                        failed_write = false;
                    }
                    Err(e) => {
                        if !failed_write {
                            log(&format!("cannot deny the host's addresses: {e}"));
                        }
                        failed_write = true;
                    }
                }
            }
        }
        let wait = watch.readable();
        let ready = if failed_write {
            tokio::time::timeout(RETRY, wait).await.ok()
        } else {
            Some(wait.await)
        };
        match ready {
            // Read again until the socket has nothing (then it is marked not ready).
            Some(Ok(mut guard)) => guard.clear_ready(),
            Some(Err(e)) => return give_up(&nft, &log, &format!("cannot wait on them: {e}")).await,
            None => {}
        }
    }
}

/// The socket failed for good: every address is denied from now on (the sandbox keeps only
/// its loopback and whatever it already had open), so that no address the host gains later
/// can reach it.
async fn give_up(nft: &str, log: &impl Fn(&str), why: &str) {
    log(&format!(
        "the host's addresses are no longer followed ({why}); the sandbox's new connections are refused"
    ));
    loop {
        match run_nft(nft, host_sets_script(None)).await {
            Ok(()) => return,
            Err(e) => log(&format!("cannot refuse the sandbox's connections: {e}")),
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn write_sets(nft: &str, nets: &BTreeSet<IpNet>) -> Result<(), String> {
    let nets: Vec<IpNet> = nets.iter().copied().collect();
    run_nft(nft, host_sets_script(Some(&nets))).await
}

async fn run_nft(nft: &str, script: String) -> Result<(), String> {
    let nft = nft.to_string();
    tokio::task::spawn_blocking(move || crate::dns::run_nft(&nft, &script))
        .await
        .map_err(|e| e.to_string())?
}

impl std::os::fd::AsRawFd for HostWatch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::DoneMessage;
    use netlink_packet_route::AddressFamily;

    fn message(new: bool, index: u32, local: Option<&str>, address: &str) -> Vec<u8> {
        let mut body = AddressMessage::default();
        let ip: IpAddr = address.parse().unwrap();
        body.header.family = if ip.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        body.header.index = index;
        body.attributes.push(AddressAttribute::Address(ip));
        if let Some(local) = local {
            body.attributes
                .push(AddressAttribute::Local(local.parse().unwrap()));
        }
        let inner = if new {
            RouteNetlinkMessage::NewAddress(body)
        } else {
            RouteNetlinkMessage::DelAddress(body)
        };
        encode(NetlinkPayload::InnerMessage(inner))
    }

    fn encode(payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut packet = NetlinkMessage::new(NetlinkHeader::default(), payload);
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        out
    }

    fn done() -> Vec<u8> {
        encode(NetlinkPayload::Done(DoneMessage::default()))
    }

    fn ips(list: &[&str]) -> BTreeSet<IpNet> {
        list.iter()
            .map(|a| IpNet::from(a.parse::<IpAddr>().unwrap()))
            .collect()
    }

    fn route(new: bool, kind: RouteType, table: u8, destination: &str) -> Vec<u8> {
        let net: IpNet = destination.parse().unwrap();
        let mut body = RouteMessage::default();
        body.header.address_family = match net {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        body.header.destination_prefix_length = net.prefix_len();
        body.header.table = table;
        body.header.kind = kind;
        body.attributes.push(RouteAttribute::Destination(
            netlink_packet_route::route::RouteAddress::from(net.addr()),
        ));
        let inner = if new {
            RouteNetlinkMessage::NewRoute(body)
        } else {
            RouteNetlinkMessage::DelRoute(body)
        };
        encode(NetlinkPayload::InnerMessage(inner))
    }

    #[test]
    fn a_dump_then_changes_give_the_hosts_addresses() {
        let mut addresses = Addresses::default();
        addresses.dump_started(Dump::Addresses);
        // Two messages in one datagram, as a dump sends them.
        let mut datagram = message(true, 1, Some("127.0.0.1"), "127.0.0.1");
        datagram.extend(message(true, 2, None, "2001:db8::5"));
        assert_eq!(addresses.read(&datagram), Next::Nothing);
        assert!(!addresses.settled(), "half a dump is not the host's list");
        assert_eq!(addresses.read(&done()), Next::DumpRoutes);
        assert!(!addresses.settled(), "the routes are still to come");
        addresses.dump_started(Dump::Routes);
        assert_eq!(addresses.read(&done()), Next::Nothing);
        assert!(addresses.settled());
        assert_eq!(addresses.current(), ips(&["127.0.0.1", "2001:db8::5"]));
        // A point-to-point link: the local end is the host's, the peer is not.
        addresses.read(&message(true, 3, Some("198.51.100.7"), "198.51.100.8"));
        assert_eq!(
            addresses.current(),
            ips(&["127.0.0.1", "198.51.100.7", "2001:db8::5"])
        );
        // On two interfaces, the address stays the host's until it is on neither.
        addresses.read(&message(true, 4, None, "2001:db8::5"));
        addresses.read(&message(false, 2, None, "2001:db8::5"));
        assert!(addresses
            .current()
            .contains(&"2001:db8::5/128".parse().unwrap()));
        addresses.read(&message(false, 4, None, "2001:db8::5"));
        assert_eq!(addresses.current(), ips(&["127.0.0.1", "198.51.100.7"]));
    }

    /// An AnyIP route's whole prefix is the host's (it answers on each of its addresses); a
    /// unicast route is not, nor is a route that was removed.
    #[test]
    fn local_routes_are_the_hosts_whole_prefixes() {
        let mut addresses = Addresses::default();
        addresses.dump_started(Dump::Addresses);
        addresses.read(&message(true, 1, None, "192.0.2.1"));
        assert_eq!(addresses.read(&done()), Next::DumpRoutes);
        addresses.dump_started(Dump::Routes);
        let mut datagram = route(true, RouteType::Local, 255, "192.0.2.1/32");
        datagram.extend(route(true, RouteType::Unicast, 254, "10.20.0.0/16"));
        datagram.extend(route(true, RouteType::Local, 255, "127.0.0.0/8"));
        addresses.read(&datagram);
        addresses.read(&done());
        assert!(addresses.settled());
        let nets = |list: &[&str]| -> BTreeSet<IpNet> {
            list.iter().map(|n| n.parse().unwrap()).collect()
        };
        assert_eq!(addresses.current(), nets(&["192.0.2.1/32", "127.0.0.0/8"]));
        addresses.read(&route(true, RouteType::Local, 255, "198.51.100.0/24"));
        addresses.read(&route(true, RouteType::Local, 100, "2001:db8:7::/64"));
        assert_eq!(
            addresses.current(),
            nets(&[
                "192.0.2.1/32",
                "127.0.0.0/8",
                "198.51.100.0/24",
                "2001:db8:7::/64"
            ])
        );
        addresses.read(&route(false, RouteType::Local, 255, "198.51.100.0/24"));
        addresses.read(&route(false, RouteType::Local, 100, "2001:db8:7::/64"));
        assert_eq!(addresses.current(), nets(&["192.0.2.1/32", "127.0.0.0/8"]));
    }

    #[test]
    fn lost_notifications_ask_for_a_dump_once_the_current_one_ends() {
        let mut addresses = Addresses::default();
        assert_eq!(addresses.overrun(), Next::Dump);
        addresses.dump_started(Dump::Addresses);
        addresses.read(&message(true, 1, None, "192.0.2.1"));
        assert_eq!(addresses.overrun(), Next::Nothing);
        assert_eq!(addresses.read(&done()), Next::Dump);
        // A dump replaces what was known (an address removed meanwhile is released).
        addresses.dump_started(Dump::Addresses);
        addresses.read(&message(true, 1, None, "192.0.2.2"));
        assert_eq!(addresses.read(&done()), Next::DumpRoutes);
        addresses.dump_started(Dump::Routes);
        addresses.read(&done());
        assert!(addresses.settled());
        assert_eq!(addresses.current(), ips(&["192.0.2.2"]));
        // Bytes that are no netlink message count as lost notifications.
        assert_eq!(addresses.read(&[1, 2, 3]), Next::Dump);
        // A refused dump is asked again, and counted until one ends.
        addresses.dump_started(Dump::Addresses);
        let mut refusal = netlink_packet_core::ErrorMessage::default();
        refusal.code = std::num::NonZeroI32::new(-libc::EBUSY);
        assert_eq!(
            addresses.read(&encode(NetlinkPayload::Error(refusal))),
            Next::Dump
        );
        assert_eq!(addresses.refused, 1);
        addresses.dump_started(Dump::Addresses);
        addresses.read(&done());
        assert_eq!(addresses.refused, 0);
    }

    /// The kernel's own messages: the socket hears addresses added to an interface of a
    /// network namespace of its own, and their removal with it.
    #[test]
    fn the_socket_hears_the_namespaces_address_changes() {
        if !nix::unistd::geteuid().is_root() {
            println!("DID NOT RUN: needs root (a network namespace of its own)");
            return;
        }
        std::thread::spawn(|| {
            // Only this thread moves: a network namespace is per task.
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a namespace");
            let watch = HostWatch::open().expect("the socket");
            let mut addresses = Addresses::default();
            watch.request_dump(Dump::Addresses).unwrap();
            addresses.dump_started(Dump::Addresses);
            let read_all = |addresses: &mut Addresses, until: &dyn Fn(&Addresses) -> bool| {
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
                while !until(addresses) {
                    assert!(std::time::Instant::now() < deadline, "{addresses:?}");
                    buffer.clear();
                    match watch.socket.recv(&mut buffer, 0) {
                        Ok(_) => {
                            if addresses.read(&buffer) == Next::DumpRoutes {
                                watch.request_dump(Dump::Routes).unwrap();
                                addresses.dump_started(Dump::Routes);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            };
            read_all(&mut addresses, &|a| a.settled());
            let ip = |args: &[&str]| {
                // A child made from this thread is in its network namespace.
                let status = std::process::Command::new("ip").args(args).status();
                assert!(status.is_ok_and(|s| s.success()), "ip {args:?}");
            };
            // A veth pair: kernels without the dummy driver have it (the gate needs it).
            ip(&[
                "link",
                "add",
                "t-watch",
                "type",
                "veth",
                "peer",
                "name",
                "t-watch-p",
            ]);
            let v4: IpAddr = "198.51.100.7".parse().unwrap();
            let v6: IpAddr = "2001:db8::7".parse().unwrap();
            ip(&["addr", "add", "198.51.100.7/32", "dev", "t-watch"]);
            ip(&["addr", "add", "2001:db8::7/128", "dev", "t-watch", "nodad"]);
            ip(&["link", "set", "t-watch", "up"]);
            read_all(&mut addresses, &|a| {
                a.current().contains(&IpNet::from(v4)) && a.current().contains(&IpNet::from(v6))
            });
            ip(&["link", "del", "t-watch"]);
            let (v4, v6) = (IpNet::from(v4), IpNet::from(v6));
            read_all(&mut addresses, &|a| {
                !a.current().contains(&v4) && !a.current().contains(&v6)
            });
            // An AnyIP route: the host answers on the whole prefix.
            let anyip: IpNet = "203.0.113.0/24".parse().unwrap();
            ip(&["link", "set", "lo", "up"]);
            ip(&["route", "add", "local", "203.0.113.0/24", "dev", "lo"]);
            read_all(&mut addresses, &|a| a.current().contains(&anyip));
            ip(&["route", "del", "local", "203.0.113.0/24", "dev", "lo"]);
            read_all(&mut addresses, &|a| !a.current().contains(&anyip));
        })
        .join()
        .expect("the thread");
    }

    /// The whole follower against the kernel and `nft`, in a network namespace of a thread's
    /// own (its "host"): the sets start as the ruleset wrote them, follow an address added and
    /// removed, and refuse every address once the follower gives up. Prints how long each
    /// change took to reach the set (polled with `nft list`, a few milliseconds a look).
    #[test]
    fn the_sets_follow_the_hosts_addresses() {
        let Some(nft) = crate::network::find_in_path("nft") else {
            println!("DID NOT RUN: no nft here");
            return;
        };
        if !nix::unistd::geteuid().is_root() {
            println!("DID NOT RUN: needs root (a network namespace of its own)");
            return;
        }
        let nft = nft.display().to_string();
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a namespace");
            let run = |program: &str, args: &[&str], input: &str| {
                let mut child = std::process::Command::new(program)
                    .args(args)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("run");
                std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes())
                    .unwrap();
                let out = child.wait_with_output().unwrap();
                assert!(out.status.success(), "{program} {args:?}");
                String::from_utf8_lossy(&out.stdout).into_owned()
            };
            let egress = crate::policy::Egress::default();
            // Written with an address the host does not have: the follower's first dump drops it.
            let stale: IpAddr = "192.0.2.99".parse().unwrap();
            run(
                &nft,
                &["-f", "-"],
                &crate::network::gate_ruleset(&egress, &[stale], &Default::default()),
            );
            let listing = || {
                run(&nft, &["list", "set", "inet", "iii_egress", "host_v4"], "")
                    + &run(&nft, &["list", "set", "inet", "iii_egress", "host_v6"], "")
            };
            let wait_for = |what: &str, done: &dyn Fn(&str) -> bool| {
                let since = std::time::Instant::now();
                loop {
                    let now = listing();
                    if done(&now) {
                        println!("{what}: {:?}", since.elapsed());
                        return;
                    }
                    assert!(since.elapsed() < Duration::from_secs(5), "{what}:\n{now}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            };
            let watch = HostWatch::open().expect("the socket");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let follower = {
                let nft = nft.clone();
                std::thread::spawn(move || {
                    // The follower runs on its own thread: it was opened in this namespace,
                    // and its `nft` runs from threads of this one's.
                    runtime.block_on(async move {
                        tokio::select! {
                            () = follow(watch, nft, |what| eprintln!("{what}")) => {}
                            () = async {
                                while stopped.try_recv().is_err() {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                            } => {}
                        }
                    });
                })
            };
            wait_for("the stale address dropped", &|l| !l.contains("192.0.2.99"));
            let ip = |args: &[&str]| {
                let status = std::process::Command::new("ip").args(args).status();
                assert!(status.is_ok_and(|s| s.success()), "ip {args:?}");
            };
            ip(&["link", "set", "lo", "up"]);
            // Loopback's local route takes in its whole prefix.
            wait_for("loopback's addresses in", &|l| {
                l.contains("127.0.0.0/8") && l.contains("::1")
            });
            ip(&["addr", "add", "198.51.100.7/32", "dev", "lo"]);
            wait_for("an IPv4 address added", &|l| l.contains("198.51.100.7"));
            ip(&["addr", "add", "2001:db8::7/128", "dev", "lo"]);
            wait_for("an IPv6 address added", &|l| l.contains("2001:db8::7"));
            ip(&["addr", "del", "198.51.100.7/32", "dev", "lo"]);
            ip(&["addr", "del", "2001:db8::7/128", "dev", "lo"]);
            wait_for("both removed", &|l| {
                !l.contains("198.51.100.7")
                    && !l.contains("2001:db8::7")
                    && l.contains("127.0.0.0/8")
            });
            // An AnyIP route added and removed: its whole prefix follows.
            ip(&["route", "add", "local", "203.0.113.0/24", "dev", "lo"]);
            wait_for("an AnyIP prefix added", &|l| l.contains("203.0.113.0/24"));
            ip(&["route", "del", "local", "203.0.113.0/24", "dev", "lo"]);
            wait_for("an AnyIP prefix removed", &|l| {
                !l.contains("203.0.113.0/24")
            });
            stop.send(()).unwrap();
            follower.join().unwrap();
            // A follower that can no longer hear the host refuses every address.
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(give_up(&nft, &|what: &str| eprintln!("{what}"), "a test"));
            let all = listing();
            assert!(all.contains("0.0.0.0/0") && all.contains("::/0"), "{all}");
        })
        .join()
        .expect("the thread");
    }
}
