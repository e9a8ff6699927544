//! Which addresses an answer puts in the ruleset's sets: those of a name of `network_allow`
//! (that the policy lets a name open) or `network_deny`, following the answer's CNAME chain,
//! each for the answer's TTL within bounds.

use std::net::IpAddr;

use hickory_proto::op::Message;
use hickory_proto::rr::RData;

use super::message::plain;
use super::{MAX_TIMEOUT_SECS, MIN_TIMEOUT_SECS};
use crate::network::{ALLOW_V4, ALLOW_V6, DENY_V4, DENY_V6};
use crate::policy::Egress;

/// CNAME links followed from the question's name, and addresses taken from one answer.
const MAX_CHAIN: usize = 16;
const MAX_ADDRESSES: usize = 64;

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
