//! Egress for a bwrap sandbox with `network: true`: a network namespace of its own (made by
//! the launcher inside the sandbox's user namespace), reached through `pasta` (Debian's
//! `passt`: user-mode networking over the host's sockets, no privilege), with the egress
//! policy as nftables rules inside that namespace, loaded before the sandbox starts. The
//! sandbox cannot change them: its agent drops CAP_NET_ADMIN before serving.
//!
//! Why pasta and rules in the namespace: pasta forwards whatever the namespace sends, so the
//! judge must sit on the namespace's side; nftables there is the kernel's own filter, refuses
//! at once (a TCP reset, an ICMP unreachable: never a hang), and costs nothing per packet
//! that pasta would not pay anyway.
//!
//! DNS: the sandbox's `/etc/resolv.conf` names [`DNS_FORWARD`], which pasta forwards to the
//! host's resolver; the names it resolves are then judged by address like anything else.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use sandbox_core::network::{default_denied, Egress};
use serde::{Deserialize, Serialize};

/// The resolver address a sandbox sees; pasta answers it with the host's resolver.
pub const DNS_FORWARD: &str = "169.254.1.53";

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
    /// The host ids pasta runs as when the adapter is root (its starter drops to them).
    pub run_as: Option<(u32, u32)>,
}

impl NetworkSetup {
    /// The setup for `egress`, denying the host's own addresses too. `run_as`: the host ids
    /// pasta runs as when the adapter is root (the sandbox's root, which owns the sandbox's
    /// user namespace); an ordinary user's pasta keeps that user's.
    pub fn new(
        nft: String,
        pasta: String,
        egress: &Egress,
        host_addrs: &[IpAddr],
        run_as: Option<(u32, u32)>,
    ) -> Self {
        let bus_on_loopback = egress.bus.filter(|bus| bus.ip().is_loopback());
        let mut pasta_args: Vec<String> = [
            "--config-net",
            "--no-map-gw",
            "--tcp-ports",
            "none",
            "--udp-ports",
            "none",
            "--udp-ns",
            "none",
            "--dns-forward",
            DNS_FORWARD,
            "--foreground",
            "--quiet",
        ]
        .map(String::from)
        .to_vec();
        pasta_args.push("--tcp-ns".into());
        // The bus on the host's loopback: its one port, forwarded from the sandbox's own
        // loopback, so the guest's III_URL works and no other host port does.
        pasta_args.push(match bus_on_loopback {
            Some(bus) => bus.port().to_string(),
            None => "none".into(),
        });
        NetworkSetup {
            nft,
            rules: ruleset(egress, host_addrs),
            pasta,
            pasta_args,
            forwarded_ports: bus_on_loopback.map(|bus| bus.port()).into_iter().collect(),
            run_as,
        }
    }
}

/// The nftables script for `egress` (see the module's comment for the order of the rules).
pub fn ruleset(egress: &Egress, host_addrs: &[IpAddr]) -> String {
    let mut rules = String::from(
        "table inet iii_egress {\n  chain output {\n    type filter hook output priority filter; policy accept;\n    oifname \"lo\" accept\n",
    );
    let _ = writeln!(
        rules,
        "    ip daddr {DNS_FORWARD} meta l4proto {{ tcp, udp }} th dport 53 accept"
    );
    if let Some(bus) = egress.bus.filter(|bus| !bus.ip().is_loopback()) {
        let _ = writeln!(rules, "    {} tcp dport {} accept", daddr(bus), bus.port());
    }
    let host: Vec<IpNet> = host_addrs.iter().map(|a| IpNet::from(*a)).collect();
    let mut denied: Vec<IpNet> = egress.deny.iter().chain(&host).copied().collect();
    if egress.allow.is_empty() {
        denied.extend(default_denied());
        reject(&mut rules, &denied);
    } else {
        reject(&mut rules, &denied);
        accept(&mut rules, &egress.allow);
        rules.push_str("    meta l4proto tcp reject with tcp reset\n    reject\n");
    }
    rules.push_str("  }\n}\n");
    rules
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
        let nets = |l: &[&str]| l.iter().map(|n| n.parse().unwrap()).collect();
        Egress {
            allow: nets(allow),
            deny: nets(deny),
            bus: bus.map(|b| b.parse().unwrap()),
        }
    }

    #[test]
    fn the_default_policy_rejects_the_special_ranges_and_the_host() {
        let rules = ruleset(&egress(&[], &[], None), &["192.0.2.2".parse().unwrap()]);
        assert!(rules.contains("oifname \"lo\" accept"), "{rules}");
        assert!(rules.contains("10.0.0.0/8"), "{rules}");
        assert!(rules.contains("169.254.0.0/16"), "{rules}");
        assert!(rules.contains("fc00::/7"), "{rules}");
        assert!(rules.contains("192.0.2.2/32"), "{rules}");
        assert!(rules.contains("reject with tcp reset"), "{rules}");
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
}
