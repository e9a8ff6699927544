//! Egress for a sandbox with `network: true`: a network namespace of its own (made by its
//! starter, the bwrap launcher or the VM runner, inside the sandbox's user namespace),
//! reached through `pasta` (Debian's `passt`: user-mode networking over the host's sockets,
//! no privilege), with the egress policy as nftables rules inside that namespace, loaded
//! before the sandbox starts. The sandbox cannot change them: its agent drops CAP_NET_ADMIN
//! before serving (and a microVM's guest has its own kernel: the rules are the runner's).
//!
//! Why pasta and rules in the namespace: pasta forwards whatever the namespace sends, so the
//! judge must sit on the namespace's side; nftables there is the kernel's own filter, refuses
//! at once (a TCP reset, an ICMP unreachable: never a hang), and costs nothing per packet
//! that pasta would not pay anyway.
//!
//! Where the rules sit depends on who opens the sandbox's sockets ([`Boundary`]). A microVM's
//! sockets are opened by its runner (TSI), in the runner's namespace, which the guest has no
//! way to act in: the rules judge what that namespace sends. A bwrap sandbox's programs share
//! the host's kernel and may hold root in their own namespaces: a packet socket's hand-built
//! frames never cross their namespace's netfilter, and pasta opens a host socket for whatever
//! destination a frame names. So a bwrap sandbox's namespace is only a client of a gate
//! namespace ([`Boundary::Gate`], see `gate.rs`) that holds the rules, routes to pasta and is
//! owned by a user namespace the sandbox's ids have no capability in.
//!
//! DNS: every query the sandbox sends (udp or tcp, port 53, to any address) is redirected to
//! the sandbox's resolver proxy (`dns.rs`), which asks the host's resolvers and, for a name in
//! `allow` or `deny`, puts the answered addresses in this ruleset's sets before the sandbox
//! sees the answer. The sandbox's `/etc/resolv.conf` names [`DNS_FORWARD`], which is only a
//! name: nothing answers there but the redirect.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::policy::{default_denied, Egress};

/// The resolver address a sandbox sees (its queries to any address go to the proxy).
pub const DNS_FORWARD: &str = "169.254.1.53";
/// Where the proxy listens inside the sandbox's namespace (127.0.0.1 and ::1), the target
/// of the redirect.
pub const DNS_PROXY_PORT: u16 = 53;
/// The gate's side of the link between a bwrap sandbox and its gate namespace.
pub const GATE_IF: &str = "iii-gate";
/// The sandbox's side of that link.
pub const SANDBOX_IF: &str = "eth0";
/// The link's prefixes are a /24 and a /64 ([`Link`]).
pub const LINK_PREFIX_V4: u8 = 24;
pub const LINK_PREFIX_V6: u8 = 64;
/// Where the link's prefixes are picked from, in order: the first that overlaps none of the
/// host's routes and addresses. First slirp4netns's numbering (10.0.2.0/24, fd00::/64: gateway
/// .2, guest .100), then ranges few networks use. The gate holds the host's routes as pasta
/// copied them: a link prefix a host route also covers would send the sandbox's packets for
/// the host's neighbours (its IPv6 gateway on a host numbered in fd00::/64, say) back to the
/// sandbox.
pub const LINK_CANDIDATES_V4: &[&str] = &[
    "10.0.2.0/24",
    "172.30.253.0/24",
    "192.168.253.0/24",
    "10.253.0.0/24",
];
pub const LINK_CANDIDATES_V6: &[&str] = &[
    "fd00::/64",
    "fd69:6969:6969::/64",
    "fdd5:2b0e:7c1a::/64",
    "fd3e:9a47:e602::/64",
];
/// The configuration keys that name the link's prefixes instead of the candidates.
pub const LINK_KEY_V4: &str = "network_link_v4";
pub const LINK_KEY_V6: &str = "network_link_v6";
/// pasta's own MTU: frames as large as pasta takes cross the link whole.
pub const LINK_MTU: u32 = 65520;
/// What the gate never forwards, whatever the lists say: the loopback ranges (the kernel
/// already drops them as martians from a non-loopback interface; written down all the same)
/// and the unspecified addresses.
const NEVER_FORWARDED: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "::1/128",
    "::/128",
    "::ffff:127.0.0.0/104",
];

/// Where the egress policy is enforced, by who opens the sandbox's sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Boundary {
    /// The starter opens them itself (a microVM's runner, through TSI): the rules judge what
    /// the starter's own namespace sends, and pasta forwards the bus port into it.
    Starter,
    /// The sandbox's programs open them, in a namespace of their own behind a gate namespace
    /// that holds the rules (forwarded traffic) and pasta; the bus port is forwarded by a
    /// process of the host's network namespace.
    Gate,
}

/// The ruleset's table, and its sets of the addresses names resolved to.
pub const TABLE: &str = "inet iii_egress";
pub const ALLOW_V4: &str = "allow_names_v4";
pub const ALLOW_V6: &str = "allow_names_v6";
pub const DENY_V4: &str = "deny_names_v4";
pub const DENY_V6: &str = "deny_names_v6";
/// The host's own addresses, refused to the sandbox: filled from the adapter's and the
/// starter's reading of them, then kept equal to them while the sandbox runs by its resolver
/// proxy (`host_watch.rs`). Interval sets, so that one element can refuse every address when
/// the host's can no longer be followed.
pub const HOST_V4: &str = "host_v4";
pub const HOST_V6: &str = "host_v6";
/// Elements one of those sets holds at most (the proxy refuses an answer past it).
pub const SET_SIZE: usize = 4096;

/// What the sandbox's resolver proxy needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsSetup {
    /// The resolvers it asks, in order.
    pub upstream: Vec<SocketAddr>,
    /// Names (and `*.` patterns) whose answers fill the allow and deny sets.
    pub allow_names: Vec<String>,
    pub deny_names: Vec<String>,
    /// See [`Egress::names_within_defaults`].
    pub names_within_defaults: bool,
}

impl DnsSetup {
    /// `egress`'s names, asking `network_dns` if set, else the host's resolvers.
    pub fn new(egress: &Egress) -> Self {
        let upstream = if egress.dns.0.is_empty() {
            std::fs::read_to_string("/etc/resolv.conf")
                .map(|text| resolv_conf_servers(&text))
                .unwrap_or_default()
        } else {
            egress.dns.0.clone()
        };
        DnsSetup {
            upstream,
            allow_names: egress.allow.names.clone(),
            deny_names: egress.deny.names.clone(),
            names_within_defaults: egress.names_within_defaults,
        }
    }
}

/// The `nameserver` lines of a resolv.conf (at most three, as glibc reads them).
pub fn resolv_conf_servers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver")).then_some(())?;
            // A scoped IPv6 address (fe80::1%eth0) names no interface we could use here.
            words.next()?.parse::<IpAddr>().ok()
        })
        .map(|ip| SocketAddr::new(ip, 53))
        .take(3)
        .collect()
}

/// A port of the sandbox's loopback (`ws://localhost:<port>` inside) and the address on the
/// host's loopback it leads to: one destination, whatever the sandbox sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusForward {
    /// The engine's port: the one the guest's `III_URL` names.
    pub port: u16,
    /// The engine itself (a worker VM), or the sandbox's endpoint of the bus guard.
    pub to: SocketAddr,
}

/// The link between a bwrap sandbox and its gate: an IPv4 /24 and an IPv6 /64, the gate at .2
/// and ::2 of them, the sandbox at .100 and ::100 (as slirp4netns numbers its guests). Picked
/// when a sandbox's set-up is made ([`Link::choose`]) and carried to its starter in the set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// The IPv4 /24's network address.
    pub v4: Ipv4Addr,
    /// The IPv6 /64's network address.
    pub v6: Ipv6Addr,
}

/// The link's prefixes the configuration names (`network_link_v4`, `network_link_v6`) instead
/// of the candidates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkPrefixes {
    pub v4: Option<Ipv4Net>,
    pub v6: Option<Ipv6Net>,
}

impl LinkPrefixes {
    /// Takes `text` as the configured prefix of `key` ([`LINK_KEY_V4`] or [`LINK_KEY_V6`]),
    /// as [`parse_link_prefix`] accepts it.
    pub fn configure(&mut self, key: &str, text: &str, host: &[IpNet]) -> Result<(), String> {
        match parse_link_prefix(key, text, key == LINK_KEY_V6, host)? {
            IpNet::V4(net) => self.v4 = Some(net),
            IpNet::V6(net) => self.v6 = Some(net),
        }
        Ok(())
    }
}

impl Default for Link {
    /// The first candidates (slirp4netns's numbering).
    fn default() -> Self {
        Link {
            v4: Ipv4Addr::new(10, 0, 2, 0),
            v6: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0),
        }
    }
}

impl Link {
    /// The configured prefixes, else for each family the first candidate that overlaps
    /// nothing of `host` (the host's routes and addresses, [`host_routes`]). A configured
    /// prefix that overlaps `host` is refused, as is a host that leaves no candidate free.
    pub fn choose(configured: &LinkPrefixes, host: &[IpNet]) -> Result<Link, String> {
        let v4 = pick(
            configured.v4.map(IpNet::V4),
            LINK_CANDIDATES_V4,
            LINK_KEY_V4,
            host,
        )?;
        let v6 = pick(
            configured.v6.map(IpNet::V6),
            LINK_CANDIDATES_V6,
            LINK_KEY_V6,
            host,
        )?;
        match (v4, v6) {
            (IpNet::V4(v4), IpNet::V6(v6)) => Ok(Link {
                v4: v4.network(),
                v6: v6.network(),
            }),
            _ => Err("a link prefix of the wrong family".into()),
        }
    }

    pub fn net_v4(&self) -> Ipv4Net {
        Ipv4Net::new_assert(self.v4, LINK_PREFIX_V4)
    }

    pub fn net_v6(&self) -> Ipv6Net {
        Ipv6Net::new_assert(self.v6, LINK_PREFIX_V6)
    }

    pub fn gate_v4(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.v4) | 2)
    }

    pub fn gate_v6(&self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.v6) | 2)
    }

    pub fn sandbox_v4(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.v4) | 100)
    }

    pub fn sandbox_v6(&self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.v6) | 0x100)
    }
}

/// `configured` when it overlaps nothing of `host`, else without one the first of
/// `candidates` that does not.
fn pick(
    configured: Option<IpNet>,
    candidates: &[&str],
    key: &str,
    host: &[IpNet],
) -> Result<IpNet, String> {
    if let Some(net) = configured {
        return match overlapping(net, host) {
            Some(used) => Err(format!(
                "`{key}` {net} overlaps the host's {used}: the gate would route a sandbox's packets for the host's neighbours back to the sandbox; name a prefix this host does not use"
            )),
            None => Ok(net),
        };
    }
    candidates
        .iter()
        .filter_map(|candidate| candidate.parse::<IpNet>().ok())
        .find(|candidate| overlapping(*candidate, host).is_none())
        .ok_or_else(|| {
            format!(
                "every candidate for the sandboxes' link ({}) overlaps one of the host's routes or addresses; name a free prefix in `{key}`",
                candidates.join(", ")
            )
        })
}

/// The first of `host` that shares an address with `net`.
pub fn overlapping(net: IpNet, host: &[IpNet]) -> Option<IpNet> {
    host.iter()
        .copied()
        .find(|used| used.contains(&net.network()) || net.contains(&used.network()))
}

/// `text` as a link prefix of the configuration's `key`: a /24 (`v6`: a /64) written as its
/// network address, of no special range (loopback, link-local, multicast, unspecified), and
/// overlapping nothing of `host`.
pub fn parse_link_prefix(key: &str, text: &str, v6: bool, host: &[IpNet]) -> Result<IpNet, String> {
    let (want, example) = if v6 {
        (LINK_PREFIX_V6, LINK_CANDIDATES_V6[1])
    } else {
        (LINK_PREFIX_V4, LINK_CANDIDATES_V4[1])
    };
    let net: IpNet = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a CIDR (e.g. {example:?})"))?;
    if matches!(net, IpNet::V6(_)) != v6 || net.prefix_len() != want {
        return Err(format!(
            "{text:?} is not an IPv{} /{want} (e.g. {example:?})",
            if v6 { 6 } else { 4 }
        ));
    }
    if net.addr() != net.network() {
        return Err(format!(
            "{text:?} has host bits set (its network is {})",
            net.trunc()
        ));
    }
    let special = [
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/3",
        "::/8",
        "fe80::/10",
        "ff00::/8",
    ];
    if let Some(range) = special
        .iter()
        .filter_map(|range| range.parse::<IpNet>().ok())
        .find(|range| range.contains(&net))
    {
        return Err(format!("{net} is in the special range {range}"));
    }
    pick(Some(net), &[], key, host)
}

/// The host's routes (every one but a default route, of every table) and its addresses: what a
/// sandbox's link must not overlap. Read anew for each sandbox (one rtnetlink dump per family
/// and the host's addresses: well under a millisecond), so that a route the host gained since
/// the adapter started is avoided by the sandboxes created after it. Where rtnetlink cannot be
/// read, `/proc`'s lists stand in (the main table's IPv4 routes, every IPv6 route).
pub fn host_routes() -> Vec<IpNet> {
    let mut nets = crate::rtnetlink::Rtnetlink::open()
        .and_then(|mut socket| socket.route_destinations())
        .unwrap_or_else(|_| {
            let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
            let mut nets = routes_v4(&read("/proc/net/route"));
            nets.extend(routes_v6(&read("/proc/net/ipv6_route")));
            nets
        });
    nets.extend(host_addresses().into_iter().map(IpNet::from));
    nets.sort();
    nets.dedup();
    nets
}

/// The destinations of `/proc/net/route` (each a native-endian hex word of the address's
/// bytes), default routes left out.
fn routes_v4(text: &str) -> Vec<IpNet> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let word = |i: usize| u32::from_str_radix(fields.get(i)?, 16).ok();
            let (destination, mask) = (word(1)?, word(7)?);
            let prefix = u8::try_from(mask.count_ones()).ok()?;
            let address = Ipv4Addr::from(destination.to_ne_bytes());
            (prefix > 0).then(|| {
                Ipv4Net::new(address, prefix)
                    .ok()
                    .map(|n| IpNet::V4(n.trunc()))
            })?
        })
        .collect()
}

/// The destinations of `/proc/net/ipv6_route` (the address in hex, then its prefix length in
/// hex), default routes left out.
fn routes_v6(text: &str) -> Vec<IpNet> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let destination = u128::from_str_radix(fields.next()?, 16).ok()?;
            let prefix = u8::from_str_radix(fields.next()?, 16).ok()?;
            let address = Ipv6Addr::from(destination);
            (prefix > 0).then(|| {
                Ipv6Net::new(address, prefix)
                    .ok()
                    .map(|n| IpNet::V6(n.trunc()))
            })?
        })
        .collect()
}

/// What the launcher needs to give a sandbox its network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSetup {
    /// `nft` and the ruleset it loads into the sandbox's namespace.
    pub nft: String,
    pub rules: String,
    /// `pasta` and its arguments, without the namespace to join (the launcher adds it).
    pub pasta: String,
    pub pasta_args: Vec<String>,
    /// Ports pasta listens on inside the namespace once it is ready (the forwarded bus).
    pub forwarded_ports: Vec<u16>,
    /// Where the rules sit.
    pub boundary: Boundary,
    /// Behind a gate: the sandbox's loopback port forwarded to the host's loopback by a
    /// process of the host's network namespace (the engine for a worker VM, the bus guard for
    /// a sandbox).
    pub bus_forward: Option<BusForward>,
    /// The host ids pasta runs as when the adapter is root (its starter drops to them).
    pub run_as: Option<(u32, u32)>,
    /// The sandbox's resolver proxy.
    pub dns: DnsSetup,
    /// Behind a gate: the link between the sandbox and its gate.
    pub link: Option<Link>,
}

impl NetworkSetup {
    /// The setup for `egress`, denying the host's own addresses too. `run_as`: the host ids
    /// pasta runs as when the adapter is root (the sandbox's root, which owns the sandbox's
    /// user namespace); an ordinary user's pasta keeps that user's. Behind a gate, the link
    /// is the first candidates' ([`Link::default`]); see [`NetworkSetup::linked`].
    pub fn new(
        nft: String,
        pasta: String,
        egress: &Egress,
        host_addrs: &[IpAddr],
        run_as: Option<(u32, u32)>,
        boundary: Boundary,
    ) -> Self {
        Self::linked(
            nft,
            pasta,
            egress,
            host_addrs,
            run_as,
            boundary,
            Link::default(),
        )
    }

    /// [`NetworkSetup::new`] with `link` between a sandbox and its gate (unused by a starter
    /// that holds the rules itself).
    pub fn linked(
        nft: String,
        pasta: String,
        egress: &Egress,
        host_addrs: &[IpAddr],
        run_as: Option<(u32, u32)>,
        boundary: Boundary,
        link: Link,
    ) -> Self {
        // A worker VM's straight line to an engine on the host's loopback, or a sandbox's
        // line to its bus guard.
        let line = egress
            .bus
            .filter(|bus| bus.ip().is_loopback())
            .map(|bus| BusForward {
                port: bus.port(),
                to: bus,
            })
            .or(egress.bus_guard);
        let (pasta_forward, bus_forward) = match boundary {
            Boundary::Starter => (line, None),
            Boundary::Gate => (None, line),
        };
        let mut pasta_args: Vec<String> = [
            "--config-net",
            "--no-map-gw",
            "--tcp-ports",
            "none",
            "--udp-ports",
            "none",
            "--udp-ns",
            "none",
            "--foreground",
            "--quiet",
        ]
        .map(String::from)
        .to_vec();
        pasta_args.push("--tcp-ns".into());
        // The bus on the host's loopback: its one port, forwarded from the sandbox's own
        // loopback (to another host port for the guard), so the guest's III_URL works and no
        // other host port does.
        pasta_args.push(match pasta_forward {
            Some(line) if line.port == line.to.port() => line.port.to_string(),
            Some(line) => format!("{}:{}", line.port, line.to.port()),
            None => "none".into(),
        });
        let rules = match boundary {
            Boundary::Starter => ruleset(egress, host_addrs),
            Boundary::Gate => gate_ruleset(egress, host_addrs, &link),
        };
        NetworkSetup {
            nft,
            rules,
            pasta,
            pasta_args,
            forwarded_ports: pasta_forward.map(|line| line.port).into_iter().collect(),
            boundary,
            bus_forward,
            run_as,
            dns: DnsSetup::new(egress),
            link: (boundary == Boundary::Gate).then_some(link),
        }
    }
}

/// The nftables script for `egress` (see the module's comment for the order of the rules).
pub fn ruleset(egress: &Egress, host_addrs: &[IpAddr]) -> String {
    let mut rules = format!("table {TABLE} {{\n");
    sets(&mut rules, host_addrs);
    // Every query, to whatever server, goes to the proxy: a name's rule cannot be sidestepped
    // by asking another resolver.
    let _ = writeln!(
        rules,
        "  chain dns {{\n    type nat hook output priority -100; policy accept;\n    meta l4proto {{ tcp, udp }} th dport 53 redirect to :{DNS_PROXY_PORT}\n  }}"
    );
    rules.push_str(
        "  chain output {\n    type filter hook output priority filter; policy accept;\n    oifname \"lo\" accept\n",
    );
    // The redirected DNS: its output interface is still the one routed before the redirect
    // (`oifname` is not "lo"), its destination the proxy on our own loopback.
    let _ = writeln!(
        rules,
        "    ip daddr 127.0.0.1 th dport {DNS_PROXY_PORT} ct status dnat accept\n    ip6 daddr ::1 th dport {DNS_PROXY_PORT} ct status dnat accept"
    );
    // A connection is judged when it starts: one to an address a name opened outlives the
    // answer's TTL.
    rules.push_str("    ct state established,related accept\n");
    judgments(&mut rules, egress);
    rules.push_str("  }\n}\n");
    rules
}

/// The nftables script a gate namespace holds for `egress`: what the sandbox's namespace
/// sends through the gate is judged as it is forwarded (whatever socket made it), DNS is
/// redirected to the proxy listening on the gate's own addresses, the gate itself answers
/// nothing else, and what passes leaves from the gate's address (pasta's side).
pub fn gate_ruleset(egress: &Egress, host_addrs: &[IpAddr], link: &Link) -> String {
    let (gate_v4, gate_v6) = (link.gate_v4(), link.gate_v6());
    let (link_v4, link_v6) = (link.net_v4(), link.net_v6());
    let mut rules = format!("table {TABLE} {{\n");
    sets(&mut rules, host_addrs);
    let _ = writeln!(
        rules,
        "  chain dns {{\n    type nat hook prerouting priority dstnat; policy accept;\n    \
         iifname \"{GATE_IF}\" meta nfproto ipv4 meta l4proto {{ tcp, udp }} th dport 53 dnat ip to {gate_v4}:{DNS_PROXY_PORT}\n    \
         iifname \"{GATE_IF}\" meta nfproto ipv6 meta l4proto {{ tcp, udp }} th dport 53 dnat ip6 to [{gate_v6}]:{DNS_PROXY_PORT}\n  }}"
    );
    // The gate's own addresses (the link's, and the host's that pasta copied onto its side)
    // answer the sandbox's DNS and neighbour discovery only: refused at once otherwise.
    let _ = writeln!(
        rules,
        "  chain input {{\n    type filter hook input priority filter; policy accept;\n    \
         iifname \"lo\" accept\n    ct state established,related accept\n    \
         iifname \"{GATE_IF}\" meta l4proto {{ tcp, udp }} th dport {DNS_PROXY_PORT} ct status dnat accept\n    \
         meta l4proto ipv6-icmp icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-advert }} accept\n    \
         meta l4proto tcp reject with tcp reset\n    reject\n  }}"
    );
    rules.push_str(
        "  chain forward {\n    type filter hook forward priority filter; policy drop;\n    ct state established,related accept\n",
    );
    // Only the sandbox's side starts anything, and only from its own link's addresses (a
    // made-up source elsewhere would leave unmasqueraded).
    let _ = writeln!(
        rules,
        "    iifname != \"{GATE_IF}\" drop\n    ip saddr != {link_v4} drop\n    ip6 saddr != {link_v6} drop"
    );
    let never: Vec<IpNet> = NEVER_FORWARDED
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    reject(&mut rules, &never);
    judgments(&mut rules, egress);
    // What no verdict above refused (the chain's policy drops only what no rule reached).
    rules.push_str("    accept\n  }\n");
    let _ = writeln!(
        rules,
        "  chain leave {{\n    type nat hook postrouting priority srcnat; policy accept;\n    \
         oifname != \"{GATE_IF}\" ip saddr {link_v4} masquerade\n    \
         oifname != \"{GATE_IF}\" ip6 saddr {link_v6} masquerade\n  }}\n}}"
    );
    rules
}

/// The address sets the resolver proxy fills, the host's holding `host_addrs` to begin with.
fn sets(rules: &mut String, host_addrs: &[IpAddr]) {
    for (set, kind) in [
        (ALLOW_V4, "ipv4_addr"),
        (ALLOW_V6, "ipv6_addr"),
        (DENY_V4, "ipv4_addr"),
        (DENY_V6, "ipv6_addr"),
    ] {
        let _ = writeln!(
            rules,
            "  set {set} {{ type {kind}; flags timeout; size {SET_SIZE}; }}"
        );
    }
    for (set, kind, v4) in [(HOST_V4, "ipv4_addr", true), (HOST_V6, "ipv6_addr", false)] {
        let elements = elements(host_addrs.iter().filter(|a| a.is_ipv4() == v4));
        let _ = if elements.is_empty() {
            writeln!(rules, "  set {set} {{ type {kind}; flags interval; }}")
        } else {
            writeln!(
                rules,
                "  set {set} {{ type {kind}; flags interval; elements = {{ {elements} }}; }}"
            )
        };
    }
}

/// `addresses` as the elements of an nftables set.
fn elements<'a>(addresses: impl Iterator<Item = &'a IpAddr>) -> String {
    addresses
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `nets` as the elements of an interval set: merged first (an interval set refuses two
/// elements that overlap, as an address inside a local route's prefix would), a single
/// address written as one.
fn net_elements(nets: &[IpNet]) -> String {
    IpNet::aggregate(&nets.to_vec())
        .iter()
        .map(|net| {
            if net.prefix_len() == net.max_prefix_len() {
                net.addr().to_string()
            } else {
                net.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Adds `host_addrs` to the host's sets of a ruleset (appended to it: the starter's own
/// reading of the host's addresses, fresher than the adapter's).
pub fn host_elements(host_addrs: &[IpAddr]) -> String {
    let nets: Vec<IpNet> = host_addrs.iter().copied().map(IpNet::from).collect();
    host_net_elements(&nets)
}

/// Adds `host_nets` (the host's addresses, and prefixes it answers on as a whole) to the
/// host's sets.
fn host_net_elements(host_nets: &[IpNet]) -> String {
    let mut script = String::new();
    for (set, v4) in [(HOST_V4, true), (HOST_V6, false)] {
        let family: Vec<IpNet> = host_nets
            .iter()
            .filter(|net| matches!(net, IpNet::V4(_)) == v4)
            .copied()
            .collect();
        if !family.is_empty() {
            let _ = writeln!(
                script,
                "add element {TABLE} {set} {{ {} }}",
                net_elements(&family)
            );
        }
    }
    script
}

/// One `nft` transaction that makes the host's sets hold exactly `host_nets`, or every
/// address when `None` (the host's can no longer be followed): never seen empty or half
/// written.
pub fn host_sets_script(host_nets: Option<&[IpNet]>) -> String {
    let mut script = format!("flush set {TABLE} {HOST_V4}\nflush set {TABLE} {HOST_V6}\n");
    match host_nets {
        Some(nets) => script.push_str(&host_net_elements(nets)),
        None => {
            let _ = writeln!(
                script,
                "add element {TABLE} {HOST_V4} {{ 0.0.0.0/0 }}\nadd element {TABLE} {HOST_V6} {{ ::/0 }}"
            );
        }
    }
    script
}

/// The policy's verdicts on a new connection's first packet, in order: DNS that escaped the
/// redirect refused, the bus allowed, the host's addresses (its sets), the denied ranges and
/// names refused, then the allow list (with its names) or everything else.
fn judgments(rules: &mut String, egress: &Egress) {
    // Not redirected (cannot happen while the dns chain stands): refused all the same.
    rules.push_str(
        "    meta l4proto tcp tcp dport 53 reject with tcp reset\n    udp dport 53 reject\n",
    );
    if let Some(bus) = egress.bus.filter(|bus| !bus.ip().is_loopback()) {
        let _ = writeln!(rules, "    {} tcp dport {} accept", daddr(bus), bus.port());
    }
    // The host's own addresses, whatever the lists say.
    reject_sets(rules, HOST_V4, HOST_V6);
    let mut denied: Vec<IpNet> = egress.deny.nets.clone();
    if egress.allow.is_empty() {
        denied.extend(default_denied());
        reject(rules, &denied);
        reject_sets(rules, DENY_V4, DENY_V6);
    } else {
        reject(rules, &denied);
        reject_sets(rules, DENY_V4, DENY_V6);
        accept(rules, &egress.allow.nets);
        let _ = writeln!(
            rules,
            "    ip daddr @{ALLOW_V4} accept\n    ip6 daddr @{ALLOW_V6} accept"
        );
        rules.push_str("    meta l4proto tcp reject with tcp reset\n    reject\n");
    }
}

/// Refused at once, the addresses of a pair of sets (the host's, the names' in
/// `network_deny`).
fn reject_sets(rules: &mut String, v4: &str, v6: &str) {
    for (family, set) in [("ip", v4), ("ip6", v6)] {
        let _ = writeln!(
            rules,
            "    {family} daddr @{set} meta l4proto tcp reject with tcp reset\n    {family} daddr @{set} reject"
        );
    }
}

fn daddr(bus: SocketAddr) -> String {
    match bus.ip() {
        IpAddr::V4(ip) => format!("ip daddr {ip}"),
        IpAddr::V6(ip) => format!("ip6 daddr {ip}"),
    }
}

/// `(family keyword, elements)` for the IPv4 and IPv6 parts of `nets` that are not empty.
fn by_family(nets: &[IpNet]) -> Vec<(&'static str, String)> {
    let join = |v4: bool| {
        nets.iter()
            .filter(|n| matches!(n, IpNet::V4(_)) == v4)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    [("ip", join(true)), ("ip6", join(false))]
        .into_iter()
        .filter(|(_, set)| !set.is_empty())
        .collect()
}

/// Refused at once: a reset for TCP, an ICMP unreachable for the rest.
fn reject(rules: &mut String, nets: &[IpNet]) {
    for (family, set) in by_family(nets) {
        let _ = writeln!(
            rules,
            "    {family} daddr {{ {set} }} meta l4proto tcp reject with tcp reset"
        );
        let _ = writeln!(rules, "    {family} daddr {{ {set} }} reject");
    }
}

fn accept(rules: &mut String, nets: &[IpNet]) {
    for (family, set) in by_family(nets) {
        let _ = writeln!(rules, "    {family} daddr {{ {set} }} accept");
    }
}

/// What giving sandboxes egress needs on this host, found once when a backend starts.
#[derive(Debug, Clone, Default)]
pub struct HostTools {
    pub pasta: Option<PathBuf>,
    pub nft: Option<PathBuf>,
    /// The host's own addresses, denied to every sandbox.
    pub host_addrs: Vec<IpAddr>,
}

impl HostTools {
    /// `pasta` and `nft` from `PATH`, and the host's addresses.
    pub fn find() -> Self {
        HostTools {
            pasta: find_in_path("pasta"),
            nft: find_in_path("nft"),
            host_addrs: host_addresses(),
        }
    }

    /// Why `network: true` cannot be served here, if it cannot.
    pub fn unavailable(&self) -> Option<&'static str> {
        if self.pasta.is_none() {
            Some("`pasta` is not installed (Debian package `passt`)")
        } else if self.nft.is_none() {
            Some("`nft` is not installed (Debian package `nftables`)")
        } else if std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .is_err()
        {
            Some("pasta cannot open /dev/net/tun as the adapter's user (Debian's default mode is 0666)")
        } else {
            None
        }
    }

    /// What `adapter::info` says of a backend's network: `namespace` (what a sandbox's
    /// namespace is there), the egress in force (its rules loaded in `rules_in`) or why there
    /// is none, the resolver proxy, and the features (`network-policy`, `network-names`).
    pub fn describe(&self, namespace: &str, rules_in: &str) -> serde_json::Value {
        let unavailable = self.unavailable();
        serde_json::json!({
            "namespace": namespace,
            "egress": unavailable.map_or_else(
                || format!("pasta with the egress policy (nftables in {rules_in})"),
                |why| format!("unavailable: {why}"),
            ),
            "dns": "every query (udp/tcp 53, any server) answered by the sandbox's resolver proxy, which judges host names in network_allow / network_deny by the addresses it resolved",
            "features": if unavailable.is_none() { vec!["network-policy", "network-names"] } else { vec![] },
        })
    }

    /// The starter's instructions for `egress` (see [`NetworkSetup::new`]), or why there
    /// are none: a sandbox never falls back to the host's network.
    pub fn setup(
        &self,
        egress: &Egress,
        run_as: Option<(u32, u32)>,
        boundary: Boundary,
    ) -> Result<NetworkSetup, String> {
        if let Some(why) = self.unavailable() {
            return Err(format!(
                "network egress needs the egress policy and {why}; a sandbox never falls back to the host's network"
            ));
        }
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let link = match boundary {
            // Chosen now, against the host's routes as they are now.
            Boundary::Gate => Link::choose(&egress.link, &host_routes())
                .map_err(|why| format!("no link between the sandbox and its gate: {why}"))?,
            Boundary::Starter => Link::default(),
        };
        Ok(NetworkSetup::linked(
            path(&self.nft),
            path(&self.pasta),
            egress,
            &self.host_addrs,
            run_as,
            boundary,
            link,
        ))
    }

    /// What `adapter::info` says of the link between a sandbox and its gate: the prefixes a
    /// sandbox created now gets (`configured`, else the first free candidates), its gate's and
    /// its own addresses, or why no sandbox can get one.
    pub fn describe_link(&self, configured: &LinkPrefixes) -> serde_json::Value {
        let how = |key: &str, set: bool, candidates: &[&str]| {
            if set {
                format!("configured ({key})")
            } else {
                format!(
                    "the first of {} that overlaps none of the host's routes and addresses, at each create",
                    candidates.join(", ")
                )
            }
        };
        match Link::choose(configured, &host_routes()) {
            Ok(link) => serde_json::json!({
                "v4": link.net_v4().to_string(),
                "v6": link.net_v6().to_string(),
                "gate": [link.gate_v4().to_string(), link.gate_v6().to_string()],
                "sandbox": [link.sandbox_v4().to_string(), link.sandbox_v6().to_string()],
                "v4_chosen": how(LINK_KEY_V4, configured.v4.is_some(), LINK_CANDIDATES_V4),
                "v6_chosen": how(LINK_KEY_V6, configured.v6.is_some(), LINK_CANDIDATES_V6),
            }),
            Err(why) => serde_json::json!({ "unavailable": why }),
        }
    }
}

/// What a sandbox with egress reads at `/etc/resolv.conf`.
pub fn resolv_conf() -> String {
    format!("nameserver {DNS_FORWARD}\n")
}

/// The first `program` on `PATH`.
pub fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The host's own addresses, which no sandbox may use to reach the host's services.
pub fn host_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<IpAddr> = addrs
        .filter_map(|ifa| {
            let address = ifa.address?;
            if let Some(v4) = address.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(allow: &[&str], deny: &[&str], bus: Option<&str>) -> Egress {
        let list = |l: &[&str]| crate::policy::parse_list("k", &serde_json::json!(l)).unwrap();
        Egress {
            allow: list(allow),
            deny: list(deny),
            bus: bus.map(|b| b.parse().unwrap()),
            ..Egress::default()
        }
    }

    #[test]
    fn all_dns_goes_to_the_proxy_and_names_fill_sets() {
        let rules = ruleset(&egress(&[], &["bad.test"], None), &[]);
        assert!(rules.contains("th dport 53 redirect to :53"), "{rules}");
        assert!(rules.contains("set deny_names_v4 { type ipv4_addr; flags timeout; size 4096; }"));
        assert!(rules.contains("ip daddr @deny_names_v4 meta l4proto tcp reject with tcp reset"));
        // Default policy: the allow sets are not consulted, nothing is refused wholesale.
        assert!(!rules.contains("@allow_names_v4"), "{rules}");
        // Only names in the allow list: the sets and nothing else.
        let rules = ruleset(&egress(&["private.test"], &[], None), &[]);
        let accept = rules.find("ip daddr @allow_names_v4 accept").unwrap();
        let deny = rules.find("ip daddr @deny_names_v4").unwrap();
        assert!(deny < accept, "deny wins: {rules}");
        assert!(rules.ends_with("    reject\n  }\n}\n"), "{rules}");
        assert!(!rules.contains("10.0.0.0/8"), "{rules}");
    }

    #[test]
    fn the_proxy_asks_the_override_else_the_hosts_resolvers() {
        let servers = resolv_conf_servers(
            "# c\nsearch x\nnameserver 192.0.2.1\nnameserver fe80::1%eth0\nnameserver ::1\nnameserver 1.1.1.1\nnameserver 8.8.8.8\n",
        );
        let want: Vec<SocketAddr> = ["192.0.2.1:53", "[::1]:53", "1.1.1.1:53"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(servers, want);
        let mut policy = egress(&["a.test"], &["*.b.test"], None);
        policy.dns = crate::policy::Upstreams(vec!["127.0.0.1:5353".parse().unwrap()]);
        let dns = DnsSetup::new(&policy);
        assert_eq!(
            dns.upstream,
            ["127.0.0.1:5353".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(dns.allow_names, ["a.test"]);
        assert_eq!(dns.deny_names, ["*.b.test"]);
    }

    #[test]
    fn the_default_policy_rejects_the_special_ranges_and_the_host() {
        let rules = ruleset(&egress(&[], &[], None), &["192.0.2.2".parse().unwrap()]);
        assert!(rules.contains("oifname \"lo\" accept"), "{rules}");
        assert!(rules.contains("10.0.0.0/8"), "{rules}");
        assert!(rules.contains("169.254.0.0/16"), "{rules}");
        assert!(rules.contains("fc00::/7"), "{rules}");
        assert!(
            rules.contains(
                "set host_v4 { type ipv4_addr; flags interval; elements = { 192.0.2.2 }; }"
            ),
            "{rules}"
        );
        assert!(
            rules.contains("set host_v6 { type ipv6_addr; flags interval; }"),
            "{rules}"
        );
        assert!(
            rules.contains("ip daddr @host_v4 meta l4proto tcp reject with tcp reset"),
            "{rules}"
        );
        assert!(rules.contains("ip6 daddr @host_v6 reject"), "{rules}");
        // Everything else passes: no catch-all reject.
        assert!(!rules.contains("\n    reject\n"), "{rules}");
    }

    #[test]
    fn an_allow_list_lets_only_its_entries_through_and_deny_wins() {
        let rules = ruleset(&egress(&["10.5.0.0/16"], &["10.5.9.0/24"], None), &[]);
        let deny = rules.find("10.5.9.0/24").unwrap();
        let allow = rules.find("10.5.0.0/16").unwrap();
        assert!(deny < allow, "{rules}");
        assert!(rules.ends_with("    reject\n  }\n}\n"), "{rules}");
        assert!(
            !rules.contains("192.168.0.0/16"),
            "the allow list replaces the defaults"
        );
    }

    #[test]
    fn the_bus_is_one_port_forwarded_or_allowed() {
        let loopback = NetworkSetup::new(
            "nft".into(),
            "pasta".into(),
            &egress(&[], &[], Some("127.0.0.1:49134")),
            &[],
            Some((7, 8)),
            Boundary::Starter,
        );
        // Its starter takes the ids itself (see netns.rs): pasta's --runas would clear the
        // parent-death signal.
        assert_eq!(loopback.run_as, Some((7, 8)));
        assert!(!loopback.pasta_args.contains(&"--runas".to_string()));
        let at = loopback
            .pasta_args
            .iter()
            .position(|a| a == "--tcp-ns")
            .unwrap();
        assert_eq!(loopback.pasta_args[at + 1], "49134");
        assert_eq!(loopback.forwarded_ports, [49134]);
        assert!(!loopback.rules.contains("dport 49134"));
        let remote = NetworkSetup::new(
            "nft".into(),
            "pasta".into(),
            &egress(&[], &[], Some("10.1.2.3:7000")),
            &[],
            None,
            Boundary::Starter,
        );
        assert_eq!(remote.run_as, None);
        let at = remote
            .pasta_args
            .iter()
            .position(|a| a == "--tcp-ns")
            .unwrap();
        assert_eq!(remote.pasta_args[at + 1], "none");
        let accept = remote
            .rules
            .find("ip daddr 10.1.2.3 tcp dport 7000 accept")
            .unwrap();
        assert!(accept < remote.rules.find("10.0.0.0/8").unwrap());
    }

    #[test]
    fn behind_a_gate_the_bus_is_forwarded_by_us_not_pasta() {
        let setup = NetworkSetup::new(
            "nft".into(),
            "pasta".into(),
            &egress(&[], &[], Some("127.0.0.1:49134")),
            &[],
            None,
            Boundary::Gate,
        );
        let at = setup
            .pasta_args
            .iter()
            .position(|a| a == "--tcp-ns")
            .unwrap();
        assert_eq!(setup.pasta_args[at + 1], "none");
        assert!(setup.forwarded_ports.is_empty());
        assert_eq!(
            setup.bus_forward,
            Some(BusForward {
                port: 49134,
                to: "127.0.0.1:49134".parse().unwrap()
            })
        );
    }

    /// A sandbox's line leads from the engine's port at its loopback to its guard's endpoint,
    /// forwarded by us behind a gate and by pasta (`port:target`) from a runner's namespace.
    #[test]
    fn a_sandboxs_bus_line_leads_to_its_guard() {
        let guard = BusForward {
            port: 49134,
            to: "127.0.0.1:40001".parse().unwrap(),
        };
        let egress = Egress {
            bus_guard: Some(guard),
            ..Egress::default()
        };
        let gate = NetworkSetup::new(
            "nft".into(),
            "pasta".into(),
            &egress,
            &[],
            None,
            Boundary::Gate,
        );
        assert_eq!(gate.bus_forward, Some(guard));
        assert!(gate.forwarded_ports.is_empty());
        // Nothing of the engine's port opens in the rules either way.
        assert!(!gate.rules.contains("49134"), "{}", gate.rules);
        let runner = NetworkSetup::new(
            "nft".into(),
            "pasta".into(),
            &egress,
            &[],
            None,
            Boundary::Starter,
        );
        let at = runner
            .pasta_args
            .iter()
            .position(|a| a == "--tcp-ns")
            .unwrap();
        assert_eq!(runner.pasta_args[at + 1], "49134:40001");
        assert_eq!(runner.forwarded_ports, [49134]);
        assert_eq!(runner.bus_forward, None);
        assert!(!runner.rules.contains("40001"), "{}", runner.rules);
    }

    #[test]
    fn the_gate_judges_forwarded_traffic_and_answers_only_dns() {
        let host: Vec<IpAddr> = vec!["192.0.2.2".parse().unwrap()];
        let rules = gate_ruleset(&egress(&["10.0.0.0/8"], &[], None), &host, &Link::default());
        let forward = rules.find("chain forward").unwrap();
        let chain = &rules[forward..];
        // Loopback is never forwarded, even with an allow list that names a private range.
        let loopback = chain.find("127.0.0.0/8").unwrap();
        let allow = chain.find("ip daddr { 10.0.0.0/8 } accept").unwrap();
        assert!(loopback < allow, "{rules}");
        // The host's addresses are refused before any list lets anything through.
        assert!(chain.find("ip daddr @host_v4").unwrap() < allow, "{rules}");
        assert!(rules.contains("elements = { 192.0.2.2 }"), "{rules}");
        assert!(chain.contains("policy drop"), "{rules}");
        assert!(rules.contains("dnat ip to 10.0.2.2:53"), "{rules}");
        assert!(rules.contains("ip saddr 10.0.2.0/24 masquerade"), "{rules}");
        // Nothing of the starter's own output chain: the gate's own sockets are the proxy's.
        assert!(!rules.contains("hook output"), "{rules}");
    }

    #[test]
    fn the_host_sets_are_rewritten_whole_in_one_transaction() {
        let host: Vec<IpAddr> = ["192.0.2.2", "2001:db8::2", "198.51.100.7"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(
            host_elements(&host),
            "add element inet iii_egress host_v4 { 192.0.2.2, 198.51.100.7 }\n\
             add element inet iii_egress host_v6 { 2001:db8::2 }\n"
        );
        assert_eq!(host_elements(&[]), "");
        let host_nets: Vec<IpNet> = host.iter().copied().map(IpNet::from).collect();
        let script = host_sets_script(Some(&host_nets));
        assert!(
            script.starts_with(
                "flush set inet iii_egress host_v4\nflush set inet iii_egress host_v6\n"
            ),
            "{script}"
        );
        assert!(script.ends_with(&host_elements(&host)), "{script}");
        // No address left: the sets emptied.
        assert_eq!(
            host_sets_script(Some(&[])),
            "flush set inet iii_egress host_v4\nflush set inet iii_egress host_v6\n"
        );
        // A prefix the host answers on as a whole (an AnyIP local route) takes in the
        // addresses inside it: an interval set refuses overlapping elements.
        let anyip = host_sets_script(Some(&nets(&[
            "198.51.100.7/32",
            "198.51.100.0/24",
            "192.0.2.2/32",
            "2001:db8:5::/64",
        ])));
        assert!(
            anyip.contains("host_v4 { 192.0.2.2, 198.51.100.0/24 }"),
            "{anyip}"
        );
        assert!(anyip.contains("host_v6 { 2001:db8:5::/64 }"), "{anyip}");
        // The host's addresses no longer followed: every address refused.
        let all = host_sets_script(None);
        assert!(all.contains("host_v4 { 0.0.0.0/0 }"), "{all}");
        assert!(all.contains("host_v6 { ::/0 }"), "{all}");
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    /// A host numbered in fd00::/64 and routing 10.0.0.0/8, with an address in the second
    /// IPv4 candidate: the link takes the first candidates that overlap none of them.
    #[test]
    fn the_link_skips_the_candidates_a_host_route_or_address_overlaps() {
        let free = Link::choose(&LinkPrefixes::default(), &[]).unwrap();
        assert_eq!(free, Link::default());
        assert_eq!(free.gate_v4().to_string(), "10.0.2.2");
        assert_eq!(free.sandbox_v4().to_string(), "10.0.2.100");
        assert_eq!(free.gate_v6().to_string(), "fd00::2");
        assert_eq!(free.sandbox_v6().to_string(), "fd00::100");

        let host = nets(&[
            "fd00::/64",
            "10.0.0.0/8",
            "172.30.253.9/32",
            "2001:db8::/32",
        ]);
        let link = Link::choose(&LinkPrefixes::default(), &host).unwrap();
        assert_eq!(link.net_v4().to_string(), "192.168.253.0/24");
        assert_eq!(link.net_v6().to_string(), "fd69:6969:6969::/64");
        assert_eq!(link.gate_v6().to_string(), "fd69:6969:6969::2");
        assert_eq!(link.sandbox_v6().to_string(), "fd69:6969:6969::100");
        for net in [IpNet::V4(link.net_v4()), IpNet::V6(link.net_v6())] {
            assert_eq!(overlapping(net, &host), None, "{net}");
        }
        // A wider route covers a candidate as surely as an equal one.
        let wide = nets(&["fd00::/16", "192.168.0.0/16", "10.0.2.0/23"]);
        let link = Link::choose(&LinkPrefixes::default(), &wide).unwrap();
        assert_eq!(link.net_v4().to_string(), "172.30.253.0/24");
        assert_eq!(link.net_v6().to_string(), "fd69:6969:6969::/64");
    }

    #[test]
    fn a_configured_link_is_used_unless_the_host_uses_it() {
        let configured = LinkPrefixes {
            v4: Some("10.77.0.0/24".parse().unwrap()),
            v6: Some("fd77::/64".parse().unwrap()),
        };
        let link = Link::choose(&configured, &nets(&["10.0.2.0/24"])).unwrap();
        assert_eq!(link.net_v4().to_string(), "10.77.0.0/24");
        assert_eq!(link.net_v6().to_string(), "fd77::/64");
        let refused = Link::choose(&configured, &nets(&["fd77::/48"])).unwrap_err();
        assert!(refused.contains("network_link_v6"), "{refused}");
        assert!(refused.contains("fd77::/48"), "{refused}");
        // No candidate left: the key that would help is named.
        let all: Vec<&str> = LINK_CANDIDATES_V4.to_vec();
        let full = Link::choose(&LinkPrefixes::default(), &nets(&all)).unwrap_err();
        assert!(full.contains("network_link_v4"), "{full}");
    }

    #[test]
    fn a_configured_prefix_is_a_free_ordinary_24_or_64() {
        let host = nets(&["192.0.2.0/24", "fd00::/64"]);
        let parse = |text: &str, v6: bool| parse_link_prefix("k", text, v6, &host);
        assert_eq!(
            parse("10.77.0.0/24", false).unwrap().to_string(),
            "10.77.0.0/24"
        );
        assert_eq!(parse("fd77::/64", true).unwrap().to_string(), "fd77::/64");
        for (text, v6, why) in [
            ("10.77.0.0/16", false, "/24"),
            ("fd77::/64", false, "IPv4"),
            ("10.77.0.0/24", true, "IPv6"),
            ("10.77.0.1/24", false, "host bits"),
            ("127.1.0.0/24", false, "special"),
            ("169.254.1.0/24", false, "special"),
            ("fe80::/64", true, "special"),
            ("192.0.2.0/24", false, "overlaps"),
            ("fd00::/64", true, "overlaps"),
            ("fd00::", true, "CIDR"),
        ] {
            let refused = parse(text, v6).unwrap_err();
            assert!(refused.contains(why), "{text}: {refused}");
        }
    }

    /// The kernel's own text (this shape is a host numbered in fd00::/64 and 192.0.2.0/24):
    /// every route but the defaults, the unreachable one on `lo` included.
    #[test]
    fn the_hosts_routes_are_read_from_proc() {
        let v4 =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  tun0\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n";
        assert_eq!(routes_v4(v4), nets(&["192.0.2.0/24", "10.0.0.0/8"]));
        let v6 = "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0\n\
                  fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000003 00000000 80200001     eth0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";
        assert_eq!(routes_v6(v6), nets(&["fd00::/64", "fd00::2/128"]));
        let mut host = routes_v4(v4);
        host.extend(routes_v6(v6));
        let link = Link::choose(&LinkPrefixes::default(), &host).unwrap();
        assert_eq!(link.net_v4().to_string(), "172.30.253.0/24");
        assert_eq!(link.net_v6().to_string(), "fd69:6969:6969::/64");
        // This host's own reading holds no default route.
        assert!(host_routes().iter().all(|net| net.prefix_len() > 0));
    }

    /// Every rule that names the link names the chosen one, and the starter gets it.
    #[test]
    fn the_gates_rules_and_set_up_follow_the_chosen_link() {
        let link = Link::choose(
            &LinkPrefixes::default(),
            &nets(&["10.0.0.0/8", "fd00::/64"]),
        )
        .unwrap();
        let setup = NetworkSetup::linked(
            "nft".into(),
            "pasta".into(),
            &egress(&[], &[], None),
            &[],
            None,
            Boundary::Gate,
            link,
        );
        let rules = &setup.rules;
        assert!(rules.contains("dnat ip to 172.30.253.2:53"), "{rules}");
        assert!(
            rules.contains("dnat ip6 to [fd69:6969:6969::2]:53"),
            "{rules}"
        );
        assert!(
            rules.contains("ip saddr != 172.30.253.0/24 drop"),
            "{rules}"
        );
        assert!(
            rules.contains("ip6 saddr != fd69:6969:6969::/64 drop"),
            "{rules}"
        );
        assert!(
            rules.contains("ip saddr 172.30.253.0/24 masquerade"),
            "{rules}"
        );
        assert!(
            rules.contains("ip6 saddr fd69:6969:6969::/64 masquerade"),
            "{rules}"
        );
        assert!(!rules.contains("10.0.2."), "{rules}");
        assert!(!rules.contains("fd00::/64"), "{rules}");
        // As the launcher receives it.
        let sent: NetworkSetup =
            serde_json::from_str(&serde_json::to_string(&setup).unwrap()).unwrap();
        assert_eq!(sent.link, Some(link));
        let starter = NetworkSetup::linked(
            "nft".into(),
            "pasta".into(),
            &egress(&[], &[], None),
            &[],
            None,
            Boundary::Starter,
            link,
        );
        assert_eq!(starter.link, None);
    }

    /// Both rulesets, with and without an allow list and a bus, load into a namespace of
    /// their own (nft's check mode asks the kernel).
    #[test]
    fn the_rulesets_load() {
        let Some(nft) = find_in_path("nft") else {
            println!("DID NOT RUN: no nft here");
            return;
        };
        if !nix::unistd::geteuid().is_root() {
            println!("DID NOT RUN: needs root for a network namespace of its own");
            return;
        }
        let host: Vec<IpAddr> = vec!["192.0.2.2".parse().unwrap(), "2001:db8::2".parse().unwrap()];
        for policy in [
            egress(&[], &["10.9.0.0/16"], Some("127.0.0.1:4000")),
            egress(
                &["10.0.0.0/8", "2001:db8:1::/48"],
                &[],
                Some("10.1.2.3:7000"),
            ),
        ] {
            // As the starter loads them (its own reading of the host's addresses added, one
            // already there), then as the resolver proxy rewrites the host's sets.
            let fresh: Vec<IpAddr> = vec!["192.0.2.2".parse().unwrap(), "::1".parse().unwrap()];
            let then = format!(
                "{}{}{}",
                host_elements(&fresh),
                host_sets_script(None),
                host_sets_script(Some(&nets(&[
                    "192.0.2.2/32",
                    "2001:db8::2/128",
                    "198.51.100.7/32",
                    "198.51.100.0/24"
                ])))
            );
            for rules in [
                ruleset(&policy, &host),
                gate_ruleset(&policy, &host, &Link::default()),
                gate_ruleset(
                    &policy,
                    &host,
                    &Link::choose(
                        &LinkPrefixes::default(),
                        &nets(&["10.0.0.0/8", "fd00::/64"]),
                    )
                    .unwrap(),
                ),
                ruleset(&policy, &[]),
            ] {
                let rules = format!("{rules}{then}");
                let mut check = std::process::Command::new("unshare")
                    .args(["-n"])
                    .arg(&nft)
                    .args(["-c", "-f", "-"])
                    .stdin(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                std::io::Write::write_all(&mut check.stdin.take().unwrap(), rules.as_bytes())
                    .unwrap();
                let out = check.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "{}\n{rules}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}
