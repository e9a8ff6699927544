//! The DNS messages the proxy reads from the sandbox and from the resolvers, and the ones it
//! writes back: every byte through `hickory-proto`, never parsed by hand, and a decoder's flaw
//! caught rather than let take the proxy down.

use std::net::{Ipv4Addr, Ipv6Addr};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

use super::{Transport, MAX_TIMEOUT_SECS};

/// Decodes one message from `bytes` without letting a flaw of the decoder take the proxy
/// down.
pub(super) fn decode(bytes: &[u8]) -> Option<Message> {
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
        || !wire_labels_ok(&question.name)
    {
        return Err(Some(error_reply(&query, ResponseCode::Refused)));
    }
    Ok(query)
}

/// Whether every label of `name`, as the wire carries it, is one a host name can hold:
/// letters, digits, `-`, and `_` (service labels such as `_dmarc` or SRV's `_tcp`; no list
/// name holds one, so it can never match). The lists and the sets judge a name by its text,
/// and a label with a dot in it (`[abcd.allowed][test]`) reads as another name
/// (`abcd.allowed.test`); a backslash, a space or a byte outside ASCII would be written as
/// an escape or not at all. Such a name is refused, never judged.
pub(super) fn wire_labels_ok(name: &Name) -> bool {
    name.iter().all(|label| {
        !label.is_empty()
            && label
                .iter()
                .all(|byte| byte.is_ascii_alphanumeric() || *byte == b'-' || *byte == b'_')
    })
}

/// Whether every name of `response`'s answers that the judge reads (each record's owner and
/// CNAME target) is one [`wire_labels_ok`] takes.
pub(super) fn answer_names_ok(response: &Message) -> bool {
    response.answers.iter().all(|record| {
        wire_labels_ok(&record.name)
            && match &record.data {
                RData::CNAME(target) => wire_labels_ok(&target.0),
                _ => true,
            }
    })
}

/// The answer to a question for `localhost` (or a name under it): its loopback addresses,
/// given here as RFC 6761 asks of a resolver. An image without `/etc/hosts` (the runtime
/// usually provides one) still finds `localhost`, where a guest's `III_URL` points.
pub(super) fn localhost_reply(query: &Message) -> Option<Vec<u8>> {
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
pub(super) fn error_reply(query: &Message, code: ResponseCode) -> Vec<u8> {
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

/// The sandbox's copy of `response`: its id, TTLs capped for a name of the lists (the sandbox
/// must not trust an address longer than the set does), cut to what it can take over udp.
pub(super) fn encode_reply(
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

/// `bytes` as the response to `ours` (same id, a response, the same question), if it is one.
pub fn read_response(bytes: &[u8], ours: &Message) -> Option<Message> {
    let response = decode(bytes)?;
    answers(&response, ours).then_some(response)
}

/// Whether `response` is the response to `ours`: same id, a response, the same question.
pub(super) fn answers(response: &Message, ours: &Message) -> bool {
    let same_question = match (response.queries.as_slice(), ours.queries.first()) {
        // Label by label (ASCII case aside): `[a.b][c]` is not `[a][b][c]`, though both read
        // `a.b.c`.
        ([theirs], Some(asked)) => {
            theirs.name == asked.name
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
