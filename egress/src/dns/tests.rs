use super::*;
use crate::network::{ALLOW_V4, DENY_V4};
use hickory_proto::op::OpCode;
use hickory_proto::op::Query;
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::Record;
use hickory_proto::rr::{Name, RData, RecordType};
use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::str::FromStr;

fn name(text: &str) -> Name {
    Name::from_str(text).unwrap()
}

fn question(text: &str, kind: RecordType) -> Message {
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(name(text), kind));
    query
}

fn response_to(query: &Message, answers: Vec<Record>) -> Message {
    let mut response = Message::response(query.metadata.id, OpCode::Query);
    response.queries = query.queries.clone();
    response.answers = answers;
    response
}

fn a(owner: &str, ip: &str, ttl: u32) -> Record {
    Record::from_rdata(name(owner), ttl, RData::A(A(ip.parse().unwrap())))
}

fn policy(allow: &[&str], deny: &[&str]) -> Egress {
    policy_of(&DnsSetup {
        upstream: Vec::new(),
        allow_names: allow.iter().map(|s| s.to_string()).collect(),
        deny_names: deny.iter().map(|s| s.to_string()).collect(),
        names_within_defaults: false,
    })
}

#[test]
fn a_standard_query_passes_and_anything_else_is_answered_or_dropped() {
    let query = question("public.test.", RecordType::A);
    let bytes = query.to_vec().unwrap();
    assert_eq!(read_query(&bytes).unwrap().queries, query.queries);
    // EDNS (the OPT record a resolver with `options edns0` adds) is no extra record.
    let mut with_edns = query.clone();
    let mut edns = hickory_proto::op::Edns::new();
    edns.set_max_payload(1232);
    with_edns.set_edns(edns);
    let parsed = read_query(&with_edns.to_vec().unwrap()).unwrap();
    assert_eq!(parsed.max_payload(), 1232);
    // A response, or garbage: dropped.
    let response = response_to(&query, Vec::new()).to_vec().unwrap();
    assert_eq!(read_query(&response), Err(None));
    assert_eq!(read_query(&bytes[..5]), Err(None));
    // Two questions: FORMERR; a zone transfer: REFUSED; another opcode: NOTIMP.
    let mut two = query.clone();
    two.add_query(Query::query(name("b.test."), RecordType::A));
    let reply = read_query(&two.to_vec().unwrap()).unwrap_err().unwrap();
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(reply.metadata.id, query.metadata.id);
    let axfr = question("public.test.", RecordType::AXFR).to_vec().unwrap();
    let reply = Message::from_vec(&read_query(&axfr).unwrap_err().unwrap()).unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::Refused);
    let mut update = query.clone();
    update.metadata.op_code = OpCode::Update;
    let reply = read_query(&update.to_vec().unwrap()).unwrap_err().unwrap();
    assert_eq!(
        Message::from_vec(&reply).unwrap().metadata.response_code,
        ResponseCode::NotImp
    );
}

#[test]
fn localhost_is_the_loopback_without_asking_anyone() {
    for (text, kind, expected) in [
        ("localhost.", RecordType::A, Some("127.0.0.1")),
        ("LocalHost.", RecordType::AAAA, Some("::1")),
        ("a.localhost.", RecordType::A, Some("127.0.0.1")),
        ("localhost.", RecordType::MX, None),
    ] {
        let query = question(text, kind);
        let reply = Message::from_vec(&localhost_reply(&query).unwrap()).unwrap();
        assert_eq!(reply.metadata.id, query.metadata.id);
        assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
        let answers: Vec<String> = reply.answers.iter().map(|r| r.data.to_string()).collect();
        assert_eq!(answers, expected.into_iter().collect::<Vec<_>>(), "{text}");
    }
    assert!(localhost_reply(&question("notlocalhost.", RecordType::A)).is_none());
    assert!(localhost_reply(&question("localhost.test.", RecordType::A)).is_none());
}

#[test]
fn hostile_bytes_never_panic() {
    let query = question("public.test.", RecordType::A).to_vec().unwrap();
    let mut crafted: Vec<Vec<u8>> = vec![
        // A compression pointer to itself, and one past the end.
        [&query[..12], &[0xC0, 0x0C, 0, 1, 0, 1][..]].concat(),
        [&query[..12], &[0xC0, 0xFF, 0, 1, 0, 1][..]].concat(),
        // Counts far beyond the data.
        [&[0, 1, 1, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF][..]].concat(),
        // A label longer than the message.
        [&query[..12], &[63, b'a', b'b'][..]].concat(),
        vec![0; MAX_QUERY],
        vec![0xFF; MAX_QUERY],
    ];
    // Cheap deterministic noise, and every cut of a valid query with bytes flipped.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    for length in 0..600 {
        let bytes = (0..length % 300)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        crafted.push(bytes);
    }
    for cut in 0..query.len() {
        for flip in 0..8 {
            let mut bytes = query[..cut].to_vec();
            if let Some(b) = bytes.get_mut(cut / 2) {
                *b ^= 1 << flip;
            }
            crafted.push(bytes);
        }
    }
    let asked = question("public.test.", RecordType::A);
    for bytes in &crafted {
        let _ = read_query(bytes);
        let _ = read_response(bytes, &asked);
    }
}

/// A name as the wire carries it: labels holding a dot (`[abcd.allowed][test]` reads
/// `abcd.allowed.test`) or bytes no host name holds are refused, in a question and in an
/// answer alike.
#[test]
fn a_name_is_judged_as_the_wire_carries_it() {
    let crafted = |labels: &[&[u8]]| {
        let mut query = Message::query();
        query.metadata.id = 7;
        query.add_query(Query::query(
            Name::from_labels(labels.iter().copied()).unwrap(),
            RecordType::A,
        ));
        query.to_vec().unwrap()
    };
    let wire = crafted(&[b"abcd.allowed", b"test"]);
    // The wire form: a 12-byte label holding the dot, then `test`.
    assert!(
        wire.windows(18).any(|w| w == b"\x0cabcd.allowed\x04test"),
        "{wire:?}"
    );
    for labels in [
        &[&b"abcd.allowed"[..], b"test"][..],
        &[b"a b", b"test"],
        &[b"a\\b", b"test"],
        &[b"caf\xc3\xa9", b"test"],
        &[b"nul\x00", b"test"],
        &[b"*", b"allowed", b"test"],
    ] {
        let reply = match read_query(&crafted(labels)) {
            Err(Some(reply)) => Message::from_vec(&reply).unwrap(),
            other => panic!("{labels:?}: {other:?}"),
        };
        assert_eq!(
            reply.metadata.response_code,
            ResponseCode::Refused,
            "{labels:?}"
        );
        assert_eq!(reply.metadata.id, 7);
    }
    for fine in [
        &[&b"_dmarc"[..], b"example", b"test"][..],
        &[b"a-1", b"test"],
        &[],
    ] {
        assert!(read_query(&crafted(fine)).is_ok(), "{fine:?}");
    }

    let query = question("abcd.allowed.test.", RecordType::A);
    let dotted = Name::from_labels([&b"abcd.allowed"[..], b"test"]).unwrap();
    let owned_by = |owner: Name| {
        let record = Record::from_rdata(owner, 60, RData::A(A("198.51.100.66".parse().unwrap())));
        response_to(&query, vec![record])
    };
    assert!(message::answer_names_ok(&owned_by(name(
        "abcd.allowed.test."
    ))));
    assert!(!message::answer_names_ok(&owned_by(dotted.clone())));
    let through = response_to(
        &query,
        vec![Record::from_rdata(
            name("abcd.allowed.test."),
            60,
            RData::CNAME(CNAME(dotted.clone())),
        )],
    );
    assert!(!message::answer_names_ok(&through));
    // A response whose question reads the same but is labelled otherwise answers another.
    let mut other = response_to(&query, Vec::new());
    other.queries[0].name = dotted;
    assert!(!message::answers(&other, &query));
    assert!(message::answers(&response_to(&query, Vec::new()), &query));
}

/// An answer owned by a name whose text would match a listed name is refused, and puts
/// nothing in the sets.
#[test]
fn an_answer_misread_as_a_listed_name_is_refused() {
    let dir = scratch("wire-names");
    let at = proxy(upstream(), &dir, false);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let query = question("allowed.test.", RecordType::AAAA);
    socket.send_to(&query.to_vec().unwrap(), at).unwrap();
    let mut buffer = [0u8; 4096];
    let (length, _) = socket.recv_from(&mut buffer).expect("an answer");
    let reply = Message::from_vec(&buffer[..length]).unwrap();
    assert_eq!(
        reply.metadata.response_code,
        ResponseCode::Refused,
        "{reply:?}"
    );
    assert!(reply.answers.is_empty());
    let script = std::fs::read_to_string(dir.join("nft.log")).unwrap_or_default();
    assert!(!script.contains("198.51.100.66"), "{script}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_response_must_answer_our_question_with_our_id() {
    let query = question("Public.TEST.", RecordType::A);
    let good = response_to(&query, vec![a("public.test.", "198.51.100.10", 60)]);
    assert!(read_response(&good.to_vec().unwrap(), &query).is_some());
    let mut wrong_id = good.clone();
    wrong_id.metadata.id = query.metadata.id.wrapping_add(1);
    assert!(read_response(&wrong_id.to_vec().unwrap(), &query).is_none());
    let other = response_to(&question("other.test.", RecordType::A), Vec::new());
    let mut other = other.clone();
    other.metadata.id = query.metadata.id;
    assert!(read_response(&other.to_vec().unwrap(), &query).is_none());
    assert!(read_response(&query.to_vec().unwrap(), &query).is_none());
}

#[test]
fn addresses_follow_the_cname_chain_only() {
    let query = question("www.test.", RecordType::A);
    let response = response_to(
        &query,
        vec![
            // Out of order on purpose; a record for a name off the chain is ignored.
            a("edge.cdn.test.", "198.51.100.20", 30),
            Record::from_rdata(
                name("www.test."),
                300,
                RData::CNAME(CNAME(name("edge.cdn.test."))),
            ),
            a("elsewhere.test.", "203.0.113.9", 30),
            Record::from_rdata(
                name("edge.cdn.test."),
                300,
                RData::AAAA(AAAA("2001:db8::20".parse().unwrap())),
            ),
        ],
    );
    let found = addresses("www.test", &response);
    assert_eq!(
        found,
        [
            ("198.51.100.20".parse().unwrap(), 30),
            ("2001:db8::20".parse().unwrap(), 300)
        ]
    );
    // A loop of CNAMEs ends.
    let looped = response_to(
        &query,
        vec![
            Record::from_rdata(name("www.test."), 1, RData::CNAME(CNAME(name("b.test.")))),
            Record::from_rdata(name("b.test."), 1, RData::CNAME(CNAME(name("www.test.")))),
        ],
    );
    assert!(addresses("www.test", &looped).is_empty());
}

#[test]
fn names_of_the_lists_fill_their_sets_with_bounded_timeouts() {
    let query = question("private.test.", RecordType::A);
    let response = response_to(
        &query,
        vec![
            a("private.test.", "10.199.0.10", 5),
            a("private.test.", "169.254.169.254", 99_999),
        ],
    );
    let judged = judge(&policy(&["private.test"], &[]), "private.test", &response);
    assert!(judged.any);
    // Metadata is never opened by a name; the timeout is bounded below.
    assert_eq!(
        judged.elements,
        [(ALLOW_V4, "10.199.0.10".parse().unwrap(), MIN_TIMEOUT_SECS)]
    );
    let judged = judge(
        &policy(&["private.test"], &["*.test"]),
        "private.test",
        &response,
    );
    assert_eq!(
        judged.elements,
        [
            (DENY_V4, "10.199.0.10".parse().unwrap(), MIN_TIMEOUT_SECS),
            (
                DENY_V4,
                "169.254.169.254".parse().unwrap(),
                MAX_TIMEOUT_SECS
            )
        ]
    );
    assert_eq!(
        judge(&policy(&["other.test"], &[]), "private.test", &response),
        Judged::default()
    );
    let mut within = policy(&["private.test"], &[]);
    within.names_within_defaults = true;
    assert!(judge(&within, "private.test", &response)
        .elements
        .is_empty());
}

#[test]
fn ttls_of_a_listed_name_are_capped_and_a_long_answer_is_cut_for_udp() {
    let query = question("public.test.", RecordType::A);
    let response = response_to(&query, vec![a("public.test.", "198.51.100.10", 86_400)]);
    let reply = encode_reply(response.clone(), &query, true, Transport::Udp).unwrap();
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(reply.answers[0].ttl, MAX_TIMEOUT_SECS);
    let many: Vec<Record> = (0..60)
        .map(|i| a("public.test.", &format!("198.51.100.{i}"), 60))
        .collect();
    let big = response_to(&query, many);
    let cut = encode_reply(big.clone(), &query, false, Transport::Udp).unwrap();
    assert!(cut.len() <= 512);
    assert!(Message::from_vec(&cut).unwrap().metadata.truncation);
    let whole = encode_reply(big, &query, false, Transport::Tcp).unwrap();
    assert_eq!(Message::from_vec(&whole).unwrap().answers.len(), 60);
}

/// A resolver on 127.0.0.1 (udp and tcp, one port) answering `public.test` and
/// `allowed.test` with 198.51.100.10 (TTL 60), anything else with no records; asked for
/// `allowed.test`'s AAAA, it answers an A record owned by the single label `allowed.test`.
fn upstream() -> SocketAddr {
    // The kernel's free udp port may be taken for tcp (CI saw AddrInUse): try another.
    let (udp, at, tcp) = (0..100)
        .find_map(|_| {
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
            let at = udp.local_addr().ok()?;
            let tcp = std::net::TcpListener::bind(at).ok()?;
            Some((udp, at, tcp))
        })
        .expect("a port free for both udp and tcp");
    let respond = |bytes: &[u8]| -> Option<Vec<u8>> {
        let query = Message::from_vec(bytes).ok()?;
        let asked = plain(&query.queries.first()?.name);
        let kind = query.queries.first()?.query_type;
        let answers = match asked.as_str() {
            // An answer owned by one label that reads as the question's two.
            "allowed.test" if kind == RecordType::AAAA => vec![Record::from_rdata(
                Name::from_labels([&b"allowed.test"[..]]).unwrap(),
                60,
                RData::A(A("198.51.100.66".parse().unwrap())),
            )],
            "public.test" | "allowed.test" => {
                vec![a(&format!("{asked}."), "198.51.100.10", 60)]
            }
            _ => Vec::new(),
        };
        response_to(&query, answers).to_vec().ok()
    };
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok((length, peer)) = udp.recv_from(&mut buffer) {
            if let Some(reply) = respond(&buffer[..length]) {
                let _ = udp.send_to(&reply, peer);
            }
        }
    });
    std::thread::spawn(move || {
        for mut stream in tcp.incoming().flatten() {
            let mut length = [0u8; 2];
            if stream.read_exact(&mut length).is_err() {
                continue;
            }
            let mut query = vec![0u8; usize::from(u16::from_be_bytes(length))];
            if stream.read_exact(&mut query).is_ok() {
                if let Some(reply) = respond(&query) {
                    let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                    framed.extend(reply);
                    let _ = stream.write_all(&framed);
                }
            }
        }
    });
    at
}

/// A proxy on 127.0.0.1 (udp and tcp, one port) asking `upstream`, with `nft` a script
/// that sleeps a little, then appends what it was given to `log` (or fails if `fail`).
fn proxy(upstream: SocketAddr, dir: &std::path::Path, fail: bool) -> SocketAddr {
    let nft = dir.join("nft");
    let log = dir.join("nft.log");
    let body = if fail {
        "#!/bin/sh\nexit 1\n".to_string()
    } else {
        format!("#!/bin/sh\nsleep 0.2\ncat >> {}\n", log.display())
    };
    std::fs::write(&nft, body).unwrap();
    std::fs::set_permissions(&nft, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The kernel's free udp port may be taken for tcp (CI saw AddrInUse): try another.
    let (udp, at, tcp) = (0..100)
        .find_map(|_| {
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
            let at = udp.local_addr().ok()?;
            let tcp = std::net::TcpListener::bind(at).ok()?;
            Some((udp, at, tcp))
        })
        .expect("a port free for both udp and tcp");
    let setup = DnsSetup {
        upstream: Vec::new(),
        allow_names: vec!["allowed.test".into()],
        deny_names: vec!["public.test".into()],
        names_within_defaults: false,
    };
    let nft = nft.display().to_string();
    std::thread::spawn(move || {
        serve(
            Listeners {
                udp: vec![udp],
                tcp: vec![tcp],
            },
            open_upstreams(&[upstream]),
            None,
            nft,
            setup,
        )
    });
    at
}

fn ask_udp_sync(proxy: SocketAddr, name_text: &str) -> Option<Message> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let query = question(name_text, RecordType::A);
    socket.send_to(&query.to_vec().unwrap(), proxy).unwrap();
    let mut buffer = [0u8; 65535];
    let (length, _) = socket.recv_from(&mut buffer).ok()?;
    let reply = Message::from_vec(&buffer[..length]).ok()?;
    assert_eq!(reply.metadata.id, query.metadata.id);
    Some(reply)
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("dns-proxy-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_listed_names_answer_comes_only_once_the_sets_hold_it() {
    let dir = scratch("sets");
    let at = proxy(upstream(), &dir, false);
    let log = dir.join("nft.log");
    let reply = ask_udp_sync(at, "Public.Test.").expect("an answer");
    assert_eq!(reply.answers.len(), 1, "{reply:?}");
    // The script sleeps before it writes: the answer waited for it.
    let script = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        script.contains("add element inet iii_egress deny_names_v4 { 198.51.100.10 timeout 60s }"),
        "{script:?}"
    );
    // An allowed name fills the allow set; an unlisted one nothing.
    ask_udp_sync(at, "allowed.test.").expect("an answer");
    let unlisted = ask_udp_sync(at, "unlisted.test.").expect("an answer");
    assert!(unlisted.answers.is_empty());
    let script = std::fs::read_to_string(&log).unwrap();
    assert!(
        script.contains("allow_names_v4 { 198.51.100.10 timeout 60s }"),
        "{script}"
    );
    assert!(!script.contains("unlisted"), "{script}");
    // Over tcp too.
    let mut stream = std::net::TcpStream::connect(at).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let query = question("public.test.", RecordType::A).to_vec().unwrap();
    let mut framed = (query.len() as u16).to_be_bytes().to_vec();
    framed.extend(&query);
    stream.write_all(&framed).unwrap();
    let mut length = [0u8; 2];
    stream.read_exact(&mut length).unwrap();
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(length))];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(Message::from_vec(&reply).unwrap().answers.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sets_that_cannot_take_an_answer_make_it_servfail() {
    let dir = scratch("fail");
    let at = proxy(upstream(), &dir, true);
    let reply = ask_udp_sync(at, "public.test.").expect("an answer");
    assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
    assert!(reply.answers.is_empty());
    // A name of no list needs no set: answered.
    let reply = ask_udp_sync(at, "unlisted.test.").expect("an answer");
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flood_is_dropped_a_burst_refused_and_the_proxy_answers_after() {
    let dir = scratch("flood");
    let at = proxy(upstream(), &dir, false);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let valid = question("unlisted.test.", RecordType::A).to_vec().unwrap();
    let mut seed: u64 = 7;
    for i in 0..6000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut bytes = valid.clone();
        bytes.truncate((seed % 40) as usize);
        if i % 3 == 0 {
            bytes = vec![(seed >> 8) as u8; (seed % 5000) as usize];
        }
        let _ = socket.send_to(&bytes, at);
    }
    // Garbage over tcp: a zero length, a length past the cap, a stalled half message.
    for garbage in [&[0u8, 0][..], &[0xFF, 0xFF, 1, 2][..], &[0, 40, 1][..]] {
        if let Ok(mut stream) = std::net::TcpStream::connect(at) {
            let _ = stream.write_all(garbage);
        }
    }
    // A burst of valid queries: past the rate some are refused, none is lost for good.
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    for _ in 0..400 {
        let _ = socket.send_to(&valid, at);
    }
    let mut codes = HashMap::new();
    let mut buffer = [0u8; 4096];
    while let Ok((length, _)) = socket.recv_from(&mut buffer) {
        if let Ok(reply) = Message::from_vec(&buffer[..length]) {
            *codes.entry(reply.metadata.response_code).or_insert(0) += 1;
        }
    }
    assert!(
        codes.get(&ResponseCode::Refused).copied().unwrap_or(0) > 0,
        "{codes:?}"
    );
    assert!(
        codes.get(&ResponseCode::NoError).copied().unwrap_or(0) > 0,
        "{codes:?}"
    );
    // Once the rate allows it again: answered.
    std::thread::sleep(Duration::from_secs(3));
    let reply = ask_udp_sync(at, "public.test.").expect("answers after the flood");
    assert_eq!(reply.answers.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
