//! A bwrap sandbox's way out, through a gate it cannot act in ([`Boundary::Gate`]).
//!
//! ```text
//!  sandbox's user namespace (nested)     starter's user namespace           host
//!  ┌ sandbox's network namespace ┐   ┌ gate network namespace ────────┐
//!  │ eth0 10.0.2.100, fd00::100  ├───┤ iii-gate 10.0.2.2, fd00::2     │
//!  │ (any socket, any frame)     │   │ nftables: forward judged, DNS  │   pasta ── host sockets
//!  └─────────────────────────────┘   │ to the proxy, masquerade       ├── tap ──┘
//!                                    └────────────────────────────────┘
//! ```
//!
//! The link's addresses are those of the first candidates ([`Link`]); a host that routes
//! 10.0.2.0/24 or fd00::/64 itself (QEMU's user networking, a network numbered in fd00::/64)
//! gets another /24 or /64 the host does not use, so the gate's route to the sandbox never
//! shadows one to the host's neighbours that pasta copied into it.
//!
//! The sandbox's namespaces belong to a user namespace nested in the starter's (the same ids,
//! mapped one to one), so the sandbox's root, whatever capabilities it keeps or regains there,
//! holds none over the gate: it can neither enter it nor change its rules. Every packet the
//! sandbox sends, from any socket including a packet socket's hand-built frames, arrives at the
//! gate as forwarded traffic and is judged there; loopback destinations are martians the gate's
//! kernel drops, the host's own address that pasta copied onto the gate's side is the gate's
//! and refused by its input chain, and every address the host has, as it has them while the
//! sandbox runs (`host_watch.rs`), is refused by the forward chain. Only then does pasta see a
//! frame.
//!
//! The resolver proxy listens on the gate's addresses and fills the gate's sets; the bus (a
//! worker VM's engine on the host's loopback, a sandbox's bus guard) is forwarded by a process
//! of the host's network namespace (`forward.rs`).
//!
//! Measured in the benchmark's `create with network: true` and download rows.
//!
//! [`Boundary::Gate`]: crate::network::Boundary::Gate

use nix::sched::{setns, unshare, CloneFlags};

use crate::dns::{Listeners, V6};
use crate::forward::{self, BusForwarder};
use crate::netns::{self, DnsProxy, PastaStarter};
use crate::network::{
    Link, NetworkSetup, GATE_IF, LINK_MTU, LINK_PREFIX_V4, LINK_PREFIX_V6, SANDBOX_IF,
};
use crate::rtnetlink::Rtnetlink;

/// Moves the caller (the bwrap launcher, root of the sandbox's user namespace, still in the
/// host's network namespace) into a new user namespace nested in its own, mapping `ids` ids
/// one to one, and a network namespace of that one, linked to a gate namespace that holds
/// `setup`'s policy, the resolver proxy and pasta. Returns once the sandbox's namespace has its
/// default route. Call while single-threaded (it forks). Failures name their cause.
pub fn connect_gated(
    starter: PastaStarter,
    setup: &NetworkSetup,
    log: &str,
    ids: u32,
) -> Result<(), String> {
    let link = setup
        .link
        .ok_or("the network set-up names no link between the sandbox and its gate")?;
    // Forked while this process is in the host's network namespace: the proxy's sockets to the
    // resolvers and the forwarder's to the bus are made there.
    let proxy =
        DnsProxy::fork(setup).map_err(|e| format!("cannot fork the resolver proxy: {e}"))?;
    let host_addrs = crate::network::host_addresses();
    let forwarder = setup
        .bus_forward
        .map(|line| BusForwarder::fork(line.to))
        .transpose()
        .map_err(|e| format!("cannot fork the bus forward: {e}"))?;
    unshare(CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("cannot make the sandbox's gate namespace: {e}"))?;
    // nft works while the gate links itself and pasta comes up: nothing can cross the gate
    // before the sandbox runs, and it runs only once the whole policy is in force.
    let rules = netns::start_loading_rules(setup, &host_addrs)?;
    netns::loopback_up().map_err(|e| format!("cannot bring the gate's loopback up: {e}"))?;
    let v6 = std::path::Path::new("/proc/net/if_inet6").exists();
    enable_forwarding(v6)?;
    let inner = nested_namespaces(ids, CloneFlags::CLONE_NEWNET)?;
    link_gate(inner.pid(), v6, &link).map_err(|e| format!("cannot link the gate: {e}"))?;
    let proxy_v6 = if v6 {
        V6::Required(link.gate_v6())
    } else {
        V6::None
    };
    // On the gate's addresses, where the gate redirects every query the sandbox sends.
    proxy.hand_over(Listeners::bind(link.gate_v4(), proxy_v6)?)?;
    netns::attach_pasta(starter, setup, log, nix::unistd::getpid())?;
    let routed_v6 = v6 && netns::has_v6_default_route();
    rules.wait()?;
    // Into the sandbox's namespaces, for good: from here this process (bwrap next) has no
    // capability over the gate.
    enter(&inner, "user", CloneFlags::CLONE_NEWUSER)?;
    enter(&inner, "net", CloneFlags::CLONE_NEWNET)?;
    drop(inner);
    link_sandbox(routed_v6, &link).map_err(|e| format!("cannot set up the sandbox's link: {e}"))?;
    if let (Some(forwarder), Some(line)) = (forwarder, setup.bus_forward) {
        forwarder.hand_over(&forward::listeners(line.port)?)?;
    }
    Ok(())
}

/// Moves the caller into a new user namespace nested in its own (ids `0..ids` mapped one to
/// one), for a sandbox without network: the same nesting as behind a gate, so the limits its
/// starter sets in its own namespace stay out of the sandbox's reach (bwrap makes its network
/// namespace, loopback only). Call while single-threaded (it forks).
pub fn enter_nested(ids: u32) -> Result<(), String> {
    let inner = nested_namespaces(ids, CloneFlags::empty())?;
    enter(&inner, "user", CloneFlags::CLONE_NEWUSER)
}

/// Moves the caller into `held`'s namespace of `kind` (`flag`).
fn enter(held: &idmap_mount::HeldNamespaces, kind: &str, flag: CloneFlags) -> Result<(), String> {
    let fd = held
        .open(kind)
        .map_err(|e| format!("cannot open the sandbox's {kind} namespace: {e}"))?;
    setns(fd, flag).map_err(|e| format!("cannot enter the sandbox's {kind} namespace: {e}"))
}

/// A user namespace nested in the caller's, its ids the caller's namespace's ids one to one,
/// owning the namespaces of `others` made with it; held by a child until dropped.
fn nested_namespaces(ids: u32, others: CloneFlags) -> Result<idmap_mount::HeldNamespaces, String> {
    // The caller is root of its namespace (CAP_SETUID and CAP_SETGID there), the parent of the
    // new one: it may map any of its ids, extent by extent as its own map has them (a nested
    // extent must fall within one of the parent's: an ordinary user's `0 -> itself` and
    // `1.. -> its subordinate range` are two). A single-id namespace denies setgroups, and the
    // nested one inherits that.
    let maps = ["uid_map", "gid_map"].map(|file| {
        let own = std::fs::read_to_string(format!("/proc/self/{file}")).unwrap_or_default();
        (file, identity_map(&own, ids))
    });
    idmap_mount::hold_new_namespaces(None, others, |pid| {
        for (file, map) in &maps {
            std::fs::write(format!("/proc/{pid}/{file}"), map).map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot write the nested {file}: {e}"))
            })?;
        }
        Ok(())
    })
    .map_err(|e| format!("cannot make the sandbox's nested namespaces: {e}"))
}

/// The map of a namespace nested in one whose own map is `own` (`/proc/self/uid_map`): each of
/// its extents' inside ids mapped to themselves, up to `ids` ids; `0 0 ids` when `own` says
/// nothing usable.
fn identity_map(own: &str, ids: u32) -> String {
    let mut map = String::new();
    for line in own.lines() {
        let fields: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        let [inside, _, count] = fields[..] else {
            continue;
        };
        let end = (inside + count).min(u64::from(ids));
        if inside < end {
            map.push_str(&format!("{inside} {inside} {}\n", end - inside));
        }
    }
    if map.is_empty() {
        map = format!("0 0 {ids}\n");
    }
    map
}

/// The gate routes between the sandbox's link and pasta's.
fn enable_forwarding(v6: bool) -> Result<(), String> {
    let mut knobs = vec!["/proc/sys/net/ipv4/ip_forward"];
    if v6 {
        knobs.push("/proc/sys/net/ipv6/conf/all/forwarding");
    }
    for knob in knobs {
        std::fs::write(knob, "1").map_err(|e| format!("cannot write {knob}: {e}"))?;
    }
    Ok(())
}

/// Makes the link, its sandbox end moved into `sandbox_pid`'s network namespace, and gives the
/// gate's end its addresses.
fn link_gate(sandbox_pid: i32, v6: bool, link: &Link) -> std::io::Result<()> {
    let mut netlink = Rtnetlink::open()?;
    let pid = u32::try_from(sandbox_pid).map_err(std::io::Error::other)?;
    netlink.add_veth(GATE_IF, SANDBOX_IF, LINK_MTU, pid)?;
    netlink.add_address(GATE_IF, link.gate_v4().into(), LINK_PREFIX_V4)?;
    if v6 {
        netlink.add_address(GATE_IF, link.gate_v6().into(), LINK_PREFIX_V6)?;
    }
    netlink.set_up(GATE_IF)
}

/// Addresses the sandbox's end and routes through the gate (called in the sandbox's network
/// namespace).
fn link_sandbox(v6: bool, link: &Link) -> std::io::Result<()> {
    netns::loopback_up()?;
    let mut netlink = Rtnetlink::open()?;
    netlink.add_address(SANDBOX_IF, link.sandbox_v4().into(), LINK_PREFIX_V4)?;
    netlink.set_up(SANDBOX_IF)?;
    netlink.add_default_route(link.gate_v4().into(), SANDBOX_IF)?;
    if v6 {
        netlink.add_address(SANDBOX_IF, link.sandbox_v6().into(), LINK_PREFIX_V6)?;
        netlink.add_default_route(link.gate_v6().into(), SANDBOX_IF)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_map_follows_the_parents_extents() {
        let user = "         0       1001          1\n         1     100000      65535\n";
        assert_eq!(identity_map(user, 65536), "0 0 1\n1 1 65535\n");
        assert_eq!(identity_map("0 2000000000 65536\n", 65536), "0 0 65536\n");
        assert_eq!(identity_map("0 1001 1\n", 1), "0 0 1\n");
        assert_eq!(identity_map("", 7), "0 0 7\n");
    }
}
