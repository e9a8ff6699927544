//! A sandbox's network (SPEC.md section 8): always a namespace of its own. `network: false`
//! gives it loopback only; `network: true` gives it user-mode egress judged by an
//! [`Egress`] policy, which the backend enforces inside the sandbox's namespace, where the
//! sandbox cannot change it.
//!
//! The policy, in order: `deny` entries are refused; then, when `allow` is not empty, only
//! its entries are reachable (an operator may list a private range there on purpose);
//! otherwise every address but [`DEFAULT_DENIED`] is. The engine (`bus`, worker VMs only) is
//! reachable whatever the lists say, and nothing else of the host.
//!
//! Entries are CIDRs or host names. A name stands for the addresses the sandbox's own DNS
//! (the backend's resolver proxy) answered for it, for as long as the answer's TTL (bounded):
//! it judges connections made after a resolution, never an address typed in by hand.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// What no sandbox reaches unless `network_allow` names it: loopback, the private ranges
/// (RFC 1918, CGNAT, ULA), link-local (with the cloud metadata address), multicast and the
/// reserved blocks.
pub const DEFAULT_DENIED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::1/128",
    "::/128",
    "::ffff:0:0/96",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// Addresses a name in `network_allow` never opens, whatever it resolves to: loopback,
/// link-local (the cloud metadata address), multicast and the reserved blocks. Those take a
/// CIDR entry.
pub const NEVER_BY_NAME: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::1/128",
    "::/128",
    "::ffff:0:0/96",
    "fe80::/10",
    "ff00::/8",
];

/// The entries of one list (`network_allow`, `network_deny`, a create's `allow` / `deny`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    pub nets: Vec<IpNet>,
    /// Host names, lowercase without a trailing dot; `*.example.com` stands for every name
    /// below `example.com` (not `example.com` itself).
    pub names: Vec<String>,
}

impl Targets {
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty() && self.names.is_empty()
    }

    /// Whether `name` (a resolved name, lowercase, no trailing dot) is one of the names.
    pub fn names_match(&self, name: &str) -> bool {
        self.names.iter().any(|pattern| covers(pattern, name))
    }
}

/// The resolvers a sandbox's DNS proxy asks (`network_dns`): `IP` or `IP:PORT` entries.
/// Empty: the host's own, from its `/etc/resolv.conf`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstreams(pub Vec<SocketAddr>);

impl<'de> Deserialize<'de> for Upstreams {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entries = Vec::<String>::deserialize(deserializer)?;
        entries
            .iter()
            .map(|entry| {
                parse_upstream(entry).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "entry {entry:?} is not a resolver address (IP or IP:PORT, e.g. \"192.0.2.53\" or \"[2001:db8::53]:5353\")"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Upstreams)
    }
}

/// `IP` (port 53) or `IP:PORT` / `[IPv6]:PORT`.
pub fn parse_upstream(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 53));
    }
    text.parse::<SocketAddr>().ok().filter(|a| a.port() != 0)
}

/// The egress policy of one sandbox with `network: true`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Egress {
    /// When not empty, the only destinations reachable (besides the bus).
    pub allow: Targets,
    /// Never reachable, whatever `allow` says.
    pub deny: Targets,
    /// The engine's address: a worker VM's one way to the bus.
    pub bus: Option<SocketAddr>,
    /// A plain sandbox's way to the bus: its loopback's port forwarded to the adapter's bus
    /// guard (never straight to the engine). Only where `bus` is `None`.
    pub bus_guard: Option<crate::network::BusForward>,
    /// Where the sandbox's DNS goes (`network_dns`; empty: the host's resolvers).
    pub dns: Upstreams,
    /// The names in `allow` came from a create under a configuration without an allow list:
    /// their addresses never open [`DEFAULT_DENIED`] either (a create narrows, never widens).
    pub names_within_defaults: bool,
    /// The link prefixes between a bwrap sandbox and its gate that the configuration names
    /// (`network_link_v4`, `network_link_v6`); unset: chosen for each sandbox.
    pub link: crate::network::LinkPrefixes,
}

impl Egress {
    /// The configuration's policy narrowed by a create's `network` object
    /// (`{"allow": [...], "deny": [...]}`): its `deny` adds to the configuration's, and its
    /// `allow` may only name ranges the configuration already lets through.
    pub fn narrowed(&self, request: &Value) -> Result<Egress, String> {
        let Value::Object(fields) = request else {
            return Err("`network` must be true, false or an object {allow?, deny?}".into());
        };
        if let Some(key) = fields.keys().find(|k| *k != "allow" && *k != "deny") {
            return Err(format!(
                "`network.{key}` is not a field (the object holds `allow` and `deny`)"
            ));
        }
        let list = |key: &str| match fields.get(key) {
            None => Ok(Targets::default()),
            Some(value) => parse_list(&format!("network.{key}"), value),
        };
        let (allow, deny) = (list("allow")?, list("deny")?);
        for net in &allow.nets {
            if !self.lets_through(net) {
                return Err(format!(
                    "`network.allow` entry {net} is wider than the configuration allows \
                     (a create may narrow the policy, never widen it)"
                ));
            }
        }
        for name in &allow.names {
            if !self.allow.is_empty() && !self.allow.names_match_pattern(name) {
                return Err(format!(
                    "`network.allow` entry {name:?} is not in the configuration's `network_allow` \
                     (a create may name a host only when that list is empty or names it)"
                ));
            }
        }
        let mut narrowed = self.clone();
        narrowed.deny.nets.extend(deny.nets);
        narrowed.deny.names.extend(deny.names);
        if !allow.is_empty() {
            // Names of a create under the default policy are held to it.
            narrowed.names_within_defaults = self.names_within_defaults || self.allow.is_empty();
            narrowed.allow = allow;
        }
        Ok(narrowed)
    }

    /// Whether every address of `net` is reachable under this policy.
    fn lets_through(&self, net: &IpNet) -> bool {
        let overlaps = |other: &IpNet| other.contains(net) || net.contains(other);
        if self.deny.nets.iter().any(overlaps) {
            return false;
        }
        if !self.allow.is_empty() {
            return self.allow.nets.iter().any(|a| a.contains(net));
        }
        !default_denied().iter().any(overlaps)
    }

    /// Whether an address that `network_allow`'s names resolved to may be let through:
    /// never [`NEVER_BY_NAME`], and under [`Egress::names_within_defaults`] nothing of
    /// [`DEFAULT_DENIED`].
    pub fn name_may_open(&self, addr: IpAddr) -> bool {
        let barred = |list: &[&str]| {
            list.iter()
                .filter_map(|n| n.parse::<IpNet>().ok())
                .any(|n| n.contains(&addr))
        };
        let barred_here = barred(NEVER_BY_NAME);
        !barred_here && (!self.names_within_defaults || !barred(DEFAULT_DENIED))
    }
}

impl Targets {
    /// Whether every name `pattern` (`name` or `*.name`) stands for is one of ours.
    fn names_match_pattern(&self, pattern: &str) -> bool {
        self.names
            .iter()
            .any(|ours| match pattern.strip_prefix("*.") {
                None => covers(ours, pattern),
                Some(below) => {
                    ours.strip_prefix("*.") == Some(below)
                        || (ours.starts_with("*.") && covers(ours, below))
                }
            })
    }
}

/// Whether `pattern` (`name` or `*.name`) stands for `name`.
fn covers(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(base) => name
            .strip_suffix(base)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => pattern == name,
    }
}

/// The engine's address from its URL (`ws://HOST:PORT/...`, default port 49134): where a
/// worker VM's bus traffic may go. `None` when it names no address we can resolve.
pub fn bus_address(url: &str) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:49134")
    } else {
        authority.to_string()
    };
    let mut addrs: Vec<SocketAddr> = with_port.to_socket_addrs().ok()?.collect();
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs.into_iter().next()
}

/// [`DEFAULT_DENIED`] parsed.
pub fn default_denied() -> Vec<IpNet> {
    DEFAULT_DENIED
        .iter()
        .filter_map(|net| net.parse().ok())
        .collect()
}

/// A list of CIDRs, addresses and host names under configuration key `key`; the error names
/// the key and the bad entry.
pub fn parse_list(key: &str, value: &Value) -> Result<Targets, String> {
    let Value::Array(items) = value else {
        return Err(format!(
            "`{key}` must be a list of CIDRs or host names such as \"203.0.113.0/24\" or \"api.example.com\""
        ));
    };
    let mut targets = Targets::default();
    for item in items {
        let text = item
            .as_str()
            .ok_or_else(|| format!("`{key}` entries must be strings, got {item}"))?;
        if let Some(net) = parse_net(text) {
            targets.nets.push(net);
        } else if let Some(name) = parse_name(text) {
            targets.names.push(name);
        } else {
            return Err(format!(
                "`{key}` entry {text:?} is not a CIDR, an IP address or a host name \
                 (RFC 1123 labels, optionally a leading `*.`)"
            ));
        }
    }
    Ok(targets)
}

/// A host name of RFC 1123 labels (letters, digits, inner hyphens; 1-63 bytes each, 253 in
/// all), optionally with one leading `*.` label and a trailing dot; lowercase, no trailing
/// dot. A name whose last label is all digits would read as an IPv4 address: refused.
pub fn parse_name(text: &str) -> Option<String> {
    let lower = text.trim().to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let (wild, base) = match name.strip_prefix("*.") {
        Some(base) => (true, base),
        None => (false, name),
    };
    if base.is_empty() || base.len() > 253 {
        return None;
    }
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let labels: Vec<&str> = base.split('.').collect();
    if !labels.iter().all(|l| label_ok(l)) {
        return None;
    }
    if labels.last()?.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(if wild {
        format!("*.{base}")
    } else {
        base.to_string()
    })
}

fn parse_net(text: &str) -> Option<IpNet> {
    let text = text.trim();
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
        .map(|net| net.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| parse_net(n).unwrap()).collect()
    }

    fn targets(list: &[&str]) -> Targets {
        parse_list("k", &json!(list)).unwrap()
    }

    #[test]
    fn lists_take_cidrs_addresses_and_names_and_name_the_bad_entry() {
        let parsed = parse_list(
            "network_allow",
            &json!([
                "10.1.0.0/16",
                "198.51.100.7",
                "fd00::/8",
                "API.Example.com.",
                "*.svc.test"
            ]),
        )
        .unwrap();
        assert_eq!(
            parsed.nets,
            nets(&["10.1.0.0/16", "198.51.100.7/32", "fd00::/8"])
        );
        assert_eq!(parsed.names, ["api.example.com", "*.svc.test"]);
        let e = parse_list("network_deny", &json!(["10.0.0.0/33"])).unwrap_err();
        assert!(
            e.contains("network_deny") && e.contains("10.0.0.0/33"),
            "{e}"
        );
        let long_label = format!("{}.test", "a".repeat(64));
        let long_name = format!("{}test", "abcdefghi.".repeat(26));
        for bad in [
            "-lead.test",
            "trail-.test",
            "under_score.test",
            "two..dots",
            "*.",
            "a.*.test",
            "**.test",
            "10.0.0.256",
            "http://x.test",
            "x.test:80",
            "",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(
                parse_list("network_deny", &json!([bad])).is_err(),
                "{bad:?}"
            );
        }
        assert!(parse_list("network_deny", &json!("10.0.0.0/8")).is_err());
        assert!(parse_list("network_deny", &json!([7])).is_err());
    }

    #[test]
    fn a_name_matches_exactly_and_a_wildcard_only_below_its_base() {
        let t = targets(&["public.test", "*.svc.test"]);
        assert!(t.names_match("public.test"));
        assert!(!t.names_match("x.public.test"));
        assert!(t.names_match("a.svc.test"));
        assert!(t.names_match("a.b.svc.test"));
        assert!(!t.names_match("svc.test"));
        assert!(!t.names_match("xsvc.test"));
    }

    #[test]
    fn resolver_addresses_take_a_default_port() {
        assert_eq!(parse_upstream("192.0.2.53"), "192.0.2.53:53".parse().ok());
        assert_eq!(
            parse_upstream("127.0.0.1:5353"),
            "127.0.0.1:5353".parse().ok()
        );
        assert_eq!(
            parse_upstream("[2001:db8::1]:54"),
            "[2001:db8::1]:54".parse().ok()
        );
        assert_eq!(
            parse_upstream("2001:db8::1"),
            "[2001:db8::1]:53".parse().ok()
        );
        for bad in ["dns.test", "1.2.3.4:0", "1.2.3.4:x", ""] {
            assert_eq!(parse_upstream(bad), None, "{bad:?}");
        }
        let bad = serde_json::from_value::<Upstreams>(json!(["nope"])).unwrap_err();
        assert!(bad.to_string().contains("nope"), "{bad}");
    }

    #[test]
    fn a_create_may_narrow_but_never_widen() {
        let config = Egress::default();
        let narrowed = config
            .narrowed(&json!({"allow": ["198.51.100.0/24"], "deny": ["198.51.100.9", "bad.test"]}))
            .unwrap();
        assert_eq!(narrowed.allow.nets, nets(&["198.51.100.0/24"]));
        assert_eq!(narrowed.deny.nets, nets(&["198.51.100.9/32"]));
        assert_eq!(narrowed.deny.names, ["bad.test"]);
        // Private, loopback and metadata ranges are not the create's to open.
        for wider in ["10.0.0.0/8", "127.0.0.1", "169.254.169.254", "0.0.0.0/0"] {
            assert!(
                config.narrowed(&json!({"allow": [wider]})).is_err(),
                "{wider}"
            );
        }
        // A name of a create under the default policy: only the addresses it allows.
        let by_name = config.narrowed(&json!({"allow": ["api.test"]})).unwrap();
        assert_eq!(by_name.allow.names, ["api.test"]);
        assert!(by_name.names_within_defaults);
        assert!(!by_name.name_may_open("10.199.0.10".parse().unwrap()));
        assert!(by_name.name_may_open("198.51.100.10".parse().unwrap()));
        // Under a configured allow list, only what it holds.
        let operator = Egress {
            allow: targets(&["10.5.0.0/16", "db.test", "*.svc.test"]),
            ..Egress::default()
        };
        assert!(operator
            .narrowed(&json!({"allow": ["10.5.1.0/24"]}))
            .is_ok());
        assert!(operator
            .narrowed(&json!({"allow": ["10.6.0.0/16"]}))
            .is_err());
        for name in ["db.test", "a.svc.test", "*.a.svc.test", "*.svc.test"] {
            let narrowed = operator.narrowed(&json!({"allow": [name]})).unwrap();
            assert!(!narrowed.names_within_defaults, "{name}");
            assert!(narrowed.name_may_open("10.5.0.1".parse().unwrap()));
        }
        for name in ["other.test", "svc.test", "*.test", "x.db.test"] {
            assert!(
                operator.narrowed(&json!({"allow": [name]})).is_err(),
                "{name}"
            );
        }
        assert!(config.narrowed(&json!({"allw": []})).is_err());
        assert!(config.narrowed(&json!("yes")).is_err());
    }

    #[test]
    fn a_name_never_opens_loopback_link_local_or_multicast() {
        let config = Egress::default();
        for addr in [
            "127.0.0.1",
            "169.254.169.254",
            "224.0.0.1",
            "::1",
            "fe80::1",
            "0.0.0.0",
        ] {
            assert!(!config.name_may_open(addr.parse().unwrap()), "{addr}");
        }
        for addr in ["10.199.0.10", "192.168.1.1", "fd00::1", "198.51.100.10"] {
            assert!(config.name_may_open(addr.parse().unwrap()), "{addr}");
        }
    }

    #[test]
    fn the_bus_address_comes_from_the_engine_url() {
        let at = |url: &str| bus_address(url).map(|a| a.to_string());
        assert_eq!(at("ws://127.0.0.1:5000").as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(at("ws://127.0.0.1").as_deref(), Some("127.0.0.1:49134"));
        assert_eq!(at("wss://[::1]:7/x").as_deref(), Some("[::1]:7"));
        assert_eq!(
            at("ws://localhost:9/path").map(|a| a.ends_with(":9")),
            Some(true)
        );
        assert_eq!(at("ws://no such host:1"), None);
    }

    #[test]
    fn the_default_lists_parse_whole() {
        assert_eq!(default_denied().len(), DEFAULT_DENIED.len());
        for net in NEVER_BY_NAME {
            assert!(net.parse::<IpNet>().is_ok(), "{net}");
        }
    }
}
