//! The few rtnetlink requests that link a gate to its sandbox (a veth pair, addresses, a link
//! up, a default route), made from the launcher's own process, and the host's routes of every
//! table, which a sandbox's link must not overlap.
//!
//! iproute2's `ip` would do the same, but a process of it per namespace cost the launcher
//! more than the kernel's work (about 1.5 ms each, the benchmark's `create with network:
//! true` row); the messages come from `netlink-packet-route`, never built by hand.
//!
//! A socket speaks to the network namespace it was opened in: open one per namespace, after
//! entering it.

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// An rtnetlink socket of the caller's network namespace, one request at a time.
pub(crate) struct Rtnetlink {
    socket: Socket,
    sequence: u32,
}

impl Rtnetlink {
    /// A socket of the network namespace the caller is in now.
    pub(crate) fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Rtnetlink {
            socket,
            sequence: 0,
        })
    }

    /// `ip link add <name> mtu <mtu> type veth peer name <peer> mtu <mtu> netns <pid>`: the
    /// pair, its `peer` end made in the network namespace of `peer_pid`.
    pub(crate) fn add_veth(
        &mut self,
        name: &str,
        peer: &str,
        mtu: u32,
        peer_pid: u32,
    ) -> io::Result<()> {
        let mut peer_end = LinkMessage::default();
        peer_end.attributes = vec![
            LinkAttribute::IfName(peer.into()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::NetNsPid(peer_pid),
        ];
        let mut link = LinkMessage::default();
        link.attributes = vec![
            LinkAttribute::IfName(name.into()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Veth),
                LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_end))),
            ]),
        ];
        self.request(
            RouteNetlinkMessage::NewLink(link),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// `ip link set <name> up`.
    pub(crate) fn set_up(&mut self, name: &str) -> io::Result<()> {
        let mut link = LinkMessage::default();
        link.header.index = index_of(name)?;
        link.header.flags = LinkFlags::Up;
        link.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(link), 0)
    }

    /// `ip addr add <address>/<prefix> dev <name> nodad` (`nodad` means something for IPv6
    /// only: the address is usable at once, without duplicate detection).
    pub(crate) fn add_address(
        &mut self,
        name: &str,
        address: IpAddr,
        prefix: u8,
    ) -> io::Result<()> {
        let mut message = AddressMessage::default();
        message.header.family = family(address);
        message.header.prefix_len = prefix;
        message.header.index = index_of(name)?;
        if address.is_ipv6() {
            message.header.flags = AddressHeaderFlags::Nodad;
        }
        message.attributes = vec![
            AddressAttribute::Local(address),
            AddressAttribute::Address(address),
        ];
        self.request(
            RouteNetlinkMessage::NewAddress(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// `ip route add default via <gateway> dev <name>`.
    pub(crate) fn add_default_route(&mut self, gateway: IpAddr, name: &str) -> io::Result<()> {
        let mut route = RouteMessage::default();
        route.header = RouteHeader {
            address_family: family(gateway),
            table: RouteHeader::RT_TABLE_MAIN,
            protocol: RouteProtocol::Boot,
            scope: RouteScope::Universe,
            kind: RouteType::Unicast,
            ..RouteHeader::default()
        };
        route.attributes = vec![
            RouteAttribute::Gateway(RouteAddress::from(gateway)),
            RouteAttribute::Oif(index_of(name)?),
        ];
        self.request(
            RouteNetlinkMessage::NewRoute(route),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// The destinations of every route of every table, both families (`ip route show table
    /// all`), default routes left out. `/proc/net/route` lists the main table only, and a route
    /// of a policy-routing table is as much the host's.
    pub(crate) fn route_destinations(&mut self) -> io::Result<Vec<IpNet>> {
        let mut nets = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut query = RouteMessage::default();
            query.header.address_family = family;
            self.sequence += 1;
            let mut header = NetlinkHeader::default();
            header.flags = NLM_F_REQUEST | NLM_F_DUMP;
            header.sequence_number = self.sequence;
            let mut packet = NetlinkMessage::new(
                header,
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetRoute(query)),
            );
            packet.finalize();
            let mut out = vec![0; packet.buffer_len()];
            packet.serialize(&mut out);
            self.socket.send(&out, 0)?;
            'dump: loop {
                let mut reply = Vec::with_capacity(64 * 1024);
                let size = self.socket.recv(&mut reply, 0)?;
                let mut rest = &reply[..size];
                while !rest.is_empty() {
                    let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                    let length = (answer.header.length as usize).next_multiple_of(4);
                    rest = &rest[length.clamp(1, rest.len())..];
                    if answer.header.sequence_number != self.sequence {
                        continue;
                    }
                    match answer.payload {
                        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(route)) => {
                            nets.extend(destination(&route).filter(|net| net.prefix_len() > 0));
                        }
                        NetlinkPayload::Done(_) => break 'dump,
                        NetlinkPayload::Error(error) if error.code.is_some() => {
                            return Err(error.to_io());
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(nets)
    }

    /// Sends one request and waits for the kernel's acknowledgement of it; its refusal as the
    /// error the kernel gave.
    fn request(&mut self, message: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.sequence += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.sequence;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        self.socket.send(&out, 0)?;
        loop {
            let mut reply = Vec::with_capacity(8192);
            let size = self.socket.recv(&mut reply, 0)?;
            let mut rest = &reply[..size];
            while !rest.is_empty() {
                let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                // Messages in one datagram start on 4-byte boundaries.
                let length = (answer.header.length as usize).next_multiple_of(4);
                let length = length.clamp(1, rest.len());
                rest = &rest[length..];
                if answer.header.sequence_number != self.sequence {
                    continue;
                }
                if let NetlinkPayload::Error(error) = answer.payload {
                    return match error.code {
                        None => Ok(()),
                        Some(_) => Err(error.to_io()),
                    };
                }
            }
        }
    }
}

/// The destination a route message names, with its prefix length (`0.0.0.0/0` or `::/0` for a
/// default route, which carries no destination).
pub(crate) fn destination(route: &RouteMessage) -> Option<IpNet> {
    let prefix = route.header.destination_prefix_length;
    let address = route
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
            RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
            _ => None,
        });
    let address = match (address, route.header.address_family) {
        (Some(address), _) => address,
        (None, AddressFamily::Inet) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    IpNet::new(address, prefix).ok().map(|net| net.trunc())
}

/// The index of the caller's namespace's link `name`.
fn index_of(name: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(name).map_err(io::Error::from)
}

fn family(address: IpAddr) -> AddressFamily {
    match address {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair made, addressed, brought up and routed in a network namespace of a thread's
    /// own, as the gate does; a second request for the same address is the kernel's EEXIST.
    #[test]
    fn a_veth_pair_is_linked_addressed_and_routed() {
        if !nix::unistd::geteuid().is_root() {
            println!("DID NOT RUN: needs root (a network namespace of its own)");
            return;
        }
        std::thread::spawn(|| {
            // Only this thread moves: a network namespace is per task.
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a namespace");
            let mut netlink = Rtnetlink::open().expect("a socket");
            let tid = u32::try_from(nix::unistd::gettid().as_raw()).unwrap();
            netlink
                .add_veth("t-gate", "t-box", 9000, tid)
                .expect("the pair");
            let gate: IpAddr = "10.9.0.1".parse().unwrap();
            let v6: IpAddr = "fd09::1".parse().unwrap();
            netlink.add_address("t-gate", gate, 24).expect("an address");
            netlink.add_address("t-box", v6, 64).expect("a v6 address");
            netlink.set_up("t-gate").expect("up");
            netlink.set_up("t-box").expect("up");
            netlink
                .add_address("t-box", "10.9.0.2".parse().unwrap(), 24)
                .expect("the other end's address");
            netlink
                .add_default_route(gate, "t-box")
                .expect("the default route");

            let routes = std::fs::read_to_string("/proc/thread-self/net/route").unwrap();
            let default = routes
                .lines()
                .find(|line| line.split_whitespace().nth(1) == Some("00000000"))
                .unwrap_or_default()
                .to_string();
            let again = netlink.add_address("t-gate", gate, 24).unwrap_err();
            let missing = netlink.set_up("t-none").unwrap_err();
            let destinations = netlink.route_destinations().expect("the routes");
            (
                default,
                again.raw_os_error(),
                missing.raw_os_error(),
                destinations,
            )
        })
        .join()
        .map(|(default, again, missing, destinations)| {
            let net = |text: &str| text.parse::<IpNet>().unwrap();
            // The main table's link route, and the local table's route of the gate's own
            // address, which `/proc/net/route` does not list; never the default route.
            for wanted in ["10.9.0.0/24", "10.9.0.1/32", "fd09::/64"] {
                assert!(
                    destinations.contains(&net(wanted)),
                    "{wanted}: {destinations:?}"
                );
            }
            assert!(
                destinations.iter().all(|d| d.prefix_len() > 0),
                "{destinations:?}"
            );
            assert!(
                default.starts_with("t-box\t00000000\t0100090A"),
                "{default}"
            );
            assert_eq!(again, Some(libc::EEXIST));
            assert_eq!(missing, Some(libc::ENODEV));
        })
        .expect("the thread");
    }
}
