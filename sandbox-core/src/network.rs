//! A sandbox's network (SPEC.md section 8): always a namespace of its own. `network: false`
//! gives it loopback only; `network: true` gives it user-mode egress judged by an
//! [`Egress`] policy, which the backend enforces inside the sandbox's namespace, where the
//! sandbox cannot change it.
//!
//! The policy, in order: `deny` entries are refused; then, when `allow` is not empty, only
//! its entries are reachable (an operator may list a private range there on purpose);
//! otherwise every address but [`DEFAULT_DENIED`] is. The engine (`bus`, worker VMs only) is
//! reachable whatever the lists say, and nothing else of the host.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
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

/// The egress policy of one sandbox with `network: true`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Egress {
    /// When not empty, the only destinations reachable (besides the bus).
    pub allow: Vec<IpNet>,
    /// Never reachable, whatever `allow` says.
    pub deny: Vec<IpNet>,
    /// The engine's address: a worker VM's one way to the bus.
    pub bus: Option<SocketAddr>,
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
            None => Ok(Vec::new()),
            Some(value) => parse_list(&format!("network.{key}"), value),
        };
        let (allow, deny) = (list("allow")?, list("deny")?);
        for net in &allow {
            if !self.lets_through(net) {
                return Err(format!(
                    "`network.allow` entry {net} is wider than the configuration allows \
                     (a create may narrow the policy, never widen it)"
                ));
            }
        }
        let mut narrowed = self.clone();
        narrowed.deny.extend(deny);
        if !allow.is_empty() {
            narrowed.allow = allow;
        }
        Ok(narrowed)
    }

    /// Whether every address of `net` is reachable under this policy.
    fn lets_through(&self, net: &IpNet) -> bool {
        let overlaps = |other: &IpNet| other.contains(net) || net.contains(other);
        if self.deny.iter().any(overlaps) {
            return false;
        }
        if !self.allow.is_empty() {
            return self.allow.iter().any(|a| a.contains(net));
        }
        !default_denied().iter().any(overlaps)
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

/// A list of CIDRs (or single addresses) under configuration key `key`; the error names the
/// key and the bad entry.
pub fn parse_list(key: &str, value: &Value) -> Result<Vec<IpNet>, String> {
    let Value::Array(items) = value else {
        return Err(format!(
            "`{key}` must be a list of CIDRs such as \"203.0.113.0/24\""
        ));
    };
    items
        .iter()
        .map(|item| {
            let text = item
                .as_str()
                .ok_or_else(|| format!("`{key}` entries must be strings, got {item}"))?;
            parse_net(text).ok_or_else(|| {
                format!(
                    "`{key}` entry {text:?} is not a CIDR or an IP address (host names are not \
                     supported yet: list the addresses)"
                )
            })
        })
        .collect()
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

    #[test]
    fn lists_take_cidrs_and_addresses_and_name_the_bad_entry() {
        assert_eq!(
            parse_list(
                "network_allow",
                &json!(["10.1.0.0/16", "198.51.100.7", "fd00::/8"])
            )
            .unwrap(),
            nets(&["10.1.0.0/16", "198.51.100.7/32", "fd00::/8"])
        );
        let e = parse_list("network_deny", &json!(["10.0.0.0/33"])).unwrap_err();
        assert!(
            e.contains("network_deny") && e.contains("10.0.0.0/33"),
            "{e}"
        );
        assert!(parse_list("network_deny", &json!(["example.com"])).is_err());
        assert!(parse_list("network_deny", &json!("10.0.0.0/8")).is_err());
        assert!(parse_list("network_deny", &json!([7])).is_err());
    }

    #[test]
    fn a_create_may_narrow_but_never_widen() {
        let config = Egress::default();
        let narrowed = config
            .narrowed(&json!({"allow": ["198.51.100.0/24"], "deny": ["198.51.100.9"]}))
            .unwrap();
        assert_eq!(narrowed.allow, nets(&["198.51.100.0/24"]));
        assert_eq!(narrowed.deny, nets(&["198.51.100.9/32"]));
        // Private, loopback and metadata ranges are not the create's to open.
        for wider in ["10.0.0.0/8", "127.0.0.1", "169.254.169.254", "0.0.0.0/0"] {
            assert!(
                config.narrowed(&json!({"allow": [wider]})).is_err(),
                "{wider}"
            );
        }
        // Under a configured allow list, only what it holds.
        let operator = Egress {
            allow: nets(&["10.5.0.0/16"]),
            ..Egress::default()
        };
        assert!(operator
            .narrowed(&json!({"allow": ["10.5.1.0/24"]}))
            .is_ok());
        assert!(operator
            .narrowed(&json!({"allow": ["10.6.0.0/16"]}))
            .is_err());
        assert!(config.narrowed(&json!({"allw": []})).is_err());
        assert!(config.narrowed(&json!("yes")).is_err());
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
    fn the_default_list_parses_whole() {
        assert_eq!(default_denied().len(), DEFAULT_DENIED.len());
    }
}
