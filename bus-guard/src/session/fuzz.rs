//! A seeded fuzzer of the guest side: thousands of frames (valid SDK messages, the same
//! mutated, random JSON, keys named twice, control and invisible characters, arrays as data,
//! long strings, bytes that are not JSON) through a sandbox's and a worker VM's session.
//!
//! The invariant: whatever the session sends the engine is the guard's own serialisation
//! (decoding it and serialising again gives the same bytes), is a message the policy allows,
//! and means what the guest's message meant once validated; and nothing panics.

use serde_json::{json, Map, Value};

use super::*;
use crate::message::{parse_guest, Guest};
use crate::name::fold;

/// xorshift64*: small, seeded, the same run every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const IDS: &[&str] = &[
    "guest::hello",
    "math::add",
    "sandbox-libkrun::create",
    "sandbox::run",
    "engine::workers::register",
    "engine::channels::create",
    "engine::functions::list",
    "configuration::get",
    "orders::tick",
    "SANDBOX-libkrun::create",
];

const NAMES: &[&str] = &[
    "guest",
    "sandbox-libkrun",
    "sandbox-libkrun\u{7}",
    "\u{1b}sandbox-libkrun",
    "sandbox-libkrun\u{202e}",
    "Sandbox-Libkrun",
    "\u{ff53}andbox-libkrun",
    "host:42",
];

const ODD: &[&str] = &[
    "\u{0}",
    "\u{7}",
    "\u{1b}[31m",
    "\u{202e}",
    "\u{200b}",
    "\u{feff}",
    "\u{2028}",
    "e\u{301}",
    "\u{ff21}",
    " ",
    "_caller_worker_id",
    "${HOME}",
    "default",
];

fn uuid(rng: &mut Rng) -> String {
    Uuid::from_u64_pair(rng.next() % 64, rng.next() % 64).to_string()
}

fn string(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => rng.pick(IDS).to_string(),
        1 => rng.pick(NAMES).to_string(),
        2 => format!("{}{}", rng.pick(IDS), rng.pick(ODD)),
        3 => rng.pick(ODD).to_string(),
        4 if rng.chance(20) => "x".repeat(rng.below(200_000)),
        _ => (0..rng.below(12))
            .map(|_| char::from_u32(rng.below(0x3000) as u32).unwrap_or('?'))
            .collect(),
    }
}

fn value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 3 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(2)),
        2 => json!(rng.next() % 2000),
        3 => json!(-(rng.below(100) as i64)),
        4 => Value::String(string(rng)),
        5 => Value::Array((0..rng.below(4)).map(|_| value(rng, depth + 1)).collect()),
        _ => Value::Object(
            (0..rng.below(4))
                .map(|_| (string(rng), value(rng, depth + 1)))
                .collect::<Map<_, _>>(),
        ),
    }
}

/// A message as an SDK would send it.
fn valid(rng: &mut Rng) -> Value {
    let maybe_id = |rng: &mut Rng| {
        if rng.chance(2) {
            Value::String(uuid(rng))
        } else {
            Value::Null
        }
    };
    match rng.below(12) {
        0 => json!({"type":"registerfunction","id":rng.pick(IDS),"description":string(rng),
                    "request_format":value(rng, 0),"metadata":{"k":string(rng)}}),
        1 => json!({"type":"unregisterfunction","id":rng.pick(IDS)}),
        2 => {
            json!({"type":"invokefunction","invocation_id":maybe_id(rng),"function_id":rng.pick(IDS),
                    "data":value(rng, 0),"namespace":if rng.chance(2) {"default"} else {"other"}})
        }
        3 => json!({"type":"invokefunction","function_id":"engine::workers::register",
                    "action":{"type":"void"},
                    "data":{"name":rng.pick(NAMES),"runtime":"rust","version":"0.25.0","os":"linux",
                            "pid":7,"features":["observe.v1","large-messages.v1"],
                            "telemetry":{"language":"en","framework":"iii-rust"}}}),
        4 => {
            json!({"type":"invokefunction","invocation_id":uuid(rng),"function_id":"engine::channels::create",
                    "data":{"buffer_size":rng.below(2000)}})
        }
        5 => {
            json!({"type":"invocationresult","invocation_id":uuid(rng),"function_id":rng.pick(IDS),
                    "result":value(rng, 0)})
        }
        6 => json!({"type":"reattach","previous_worker_id":uuid(rng),"reattach_token":uuid(rng)}),
        7 => json!({"type":"registertrigger","id":uuid(rng),"trigger_type":"cron",
                    "function_id":rng.pick(IDS),"config":value(rng, 0)}),
        8 => json!({"type":"registertriggertype","id":"hook","description":string(rng)}),
        9 => json!({"type":"triggerregistrationresult","id":uuid(rng),"trigger_type":"hook",
                    "function_id":rng.pick(IDS)}),
        10 => json!({"type":"registerfunction","id":"guest::lambda",
                     "invocation":{"url":"https://example.com","auth":{"type":"bearer","token_key":"K"}}}),
        _ => json!({"type":"ping"}),
    }
}

/// Changes one thing of `message`: a field's value, a new field, a field gone, data that is
/// an array.
fn mutate(rng: &mut Rng, message: &mut Value) {
    let Value::Object(map) = message else {
        return;
    };
    let keys: Vec<String> = map.keys().cloned().collect();
    match rng.below(5) {
        0 if !keys.is_empty() => {
            let key = rng.pick(&keys).clone();
            map.insert(key, value(rng, 0));
        }
        1 => {
            map.insert(string(rng), value(rng, 0));
        }
        2 if !keys.is_empty() => {
            let key = rng.pick(&keys).clone();
            map.remove(&key);
        }
        3 => {
            map.insert("data".into(), json!([uuid(rng), "name", string(rng)]));
        }
        _ => {
            if let Some(Value::Object(data)) = map.get_mut("data") {
                data.insert(rng.pick(ODD).to_string(), value(rng, 0));
            }
        }
    }
}

/// The frame of `message`, sometimes with a key named twice spliced in.
fn frame(rng: &mut Rng, message: &Value) -> Vec<u8> {
    let text = message.to_string();
    if rng.chance(8) {
        if let Some(Value::Object(map)) = Some(message) {
            if let Some((key, _)) = map.iter().next() {
                let twice = format!("{{{}:{},", Value::String(key.clone()), value(rng, 2));
                return text.replacen('{', &twice, 1).into_bytes();
            }
        }
    }
    if rng.chance(8) && text.contains("\"data\":{") {
        // The same key twice inside `data`, where only a strict reader sees it.
        let key = Value::String(rng.pick(NAMES).to_string());
        let twice = format!("\"data\":{{{key}:1,{key}:2,");
        let spliced = text.replacen("\"data\":{", &twice, 1).replace(",}", "}");
        return spliced.into_bytes();
    }
    if rng.chance(30) {
        let mut bytes = text.into_bytes();
        let at = rng.below(bytes.len().max(1));
        bytes.truncate(at);
        bytes.push(rng.next() as u8);
        return bytes;
    }
    text.into_bytes()
}

/// What `sent` (the guard's frame to the engine) must be, given the guest's `input`.
fn check(session: &Session, input: Option<&Guest>, sent: &str) {
    let policy = &session.ctx.policy;
    let reparsed = parse_guest(sent.as_bytes()).expect("the guard's frame decodes");
    let again = match reparsed.clone() {
        Guest::RegisterFunction(m) => ToEngine::RegisterFunction(m),
        Guest::UnregisterFunction(m) => ToEngine::UnregisterFunction(m),
        Guest::InvokeFunction(m) => ToEngine::InvokeFunction(m),
        Guest::InvocationResult(m) => ToEngine::InvocationResult(m),
        Guest::Reattach(m) => ToEngine::Reattach(m),
        Guest::RegisterTriggerType(m) => ToEngine::RegisterTriggerType(m),
        Guest::UnregisterTriggerType(m) => ToEngine::UnregisterTriggerType(m),
        Guest::RegisterTrigger(m) => ToEngine::RegisterTrigger(m),
        Guest::UnregisterTrigger(m) => ToEngine::UnregisterTrigger(m),
        Guest::TriggerRegistrationResult(m) => ToEngine::TriggerRegistrationResult(m),
        other => panic!("the guard sent the engine {other:?}"),
    };
    assert_eq!(again.text(), sent, "not the guard's own serialisation");
    let input = input.expect("nothing goes on from a frame that does not decode");
    let clean_id = |id: &str| assert_eq!(clean(id, Kind::Id).as_deref(), Ok(id), "{id:?}");
    match (&reparsed, input) {
        (Guest::RegisterFunction(out), Guest::RegisterFunction(inp)) => {
            clean_id(&out.id);
            assert!(policy.may_register(&out.id).is_ok(), "{}", out.id);
            assert!(out.invocation.is_none() || policy.http_functions());
            assert!(out.invocation.as_ref().is_none_or(|i| i.auth.is_none()));
            let mut expected = inp.clone();
            expected.id = out.id.clone();
            expected.description = out.description.clone();
            expected.observe = None;
            assert_eq!(*out, expected);
            assert_eq!(clean(&inp.id, Kind::Id).as_deref(), Ok(out.id.as_str()));
        }
        (Guest::UnregisterFunction(out), Guest::UnregisterFunction(inp)) => assert_eq!(out, inp),
        (Guest::InvokeFunction(out), Guest::InvokeFunction(inp)) => {
            clean_id(&out.function_id);
            assert!(policy.may_call(&out.function_id).is_ok());
            assert!(policy.may_use_namespace(out.namespace.as_deref()).is_ok());
            assert!(out.caller.is_none() && out.observe_depth.is_none());
            assert_eq!(out.invocation_id, inp.invocation_id);
            if out.function_id == WORKER_ANNOUNCEMENT {
                let Value::Object(data) = &out.data else {
                    panic!("announcement data {:?}", out.data)
                };
                assert!(data.keys().all(|k| !k.starts_with('_')), "{data:?}");
                let name = data["name"].as_str().unwrap();
                assert!(policy.may_name_worker(name).is_ok(), "{name:?}");
                assert_ne!(fold(name), "sandbox-libkrun");
                assert!(out.namespace.is_none());
                let announced: Announcement = serde_json::from_value(out.data.clone()).unwrap();
                let Ok(given) = serde_json::from_value::<Announcement>(inp.data.clone()) else {
                    panic!("an announcement went on that did not decode")
                };
                assert_eq!(clean(&given.name, Kind::Label).as_deref(), Ok(name));
                assert_eq!(announced.pid, given.pid);
            } else if out.function_id == CHANNEL_CREATE {
                let Value::Object(data) = &out.data else {
                    panic!("channel data {:?}", out.data)
                };
                assert!(data.keys().all(|k| k == "buffer_size"), "{data:?}");
                assert_eq!(out.data, {
                    let mut d = inp.data.clone();
                    if let Value::Object(m) = &mut d {
                        m.retain(|_, v| !v.is_null());
                    }
                    d
                });
            } else {
                let mut expected = inp.clone();
                expected.function_id = out.function_id.clone();
                expected.caller = None;
                expected.observe_depth = None;
                assert_eq!(*out, expected);
            }
        }
        (Guest::InvocationResult(out), Guest::InvocationResult(inp)) => {
            assert_eq!(out.invocation_id, inp.invocation_id);
            assert_eq!(out.result, inp.result);
            assert_eq!(out.error, inp.error);
        }
        (Guest::Reattach(out), Guest::Reattach(inp)) => assert_eq!(out, inp),
        (Guest::RegisterTrigger(out), Guest::RegisterTrigger(inp)) => {
            assert!(policy.is_worker_vm());
            assert!(policy.may_register(&out.function_id).is_ok());
            assert_eq!(out.config, inp.config);
        }
        (Guest::RegisterTriggerType(_), Guest::RegisterTriggerType(_))
        | (Guest::UnregisterTriggerType(_), Guest::UnregisterTriggerType(_))
        | (Guest::UnregisterTrigger(_), Guest::UnregisterTrigger(_))
        | (Guest::TriggerRegistrationResult(_), Guest::TriggerRegistrationResult(_)) => {
            assert!(policy.is_worker_vm());
        }
        (out, inp) => panic!("{inp:?} went on as {out:?}"),
    }
}

/// Runs `frames` frames; returns how many went on to the engine per message type, so a run
/// that sends nothing on (and so checks nothing) fails.
fn run(mut session: Session, seed: u64, frames: usize) -> HashMap<String, usize> {
    let mut rng = Rng(seed);
    let mut sent_on: HashMap<String, usize> = HashMap::new();
    for _ in 0..frames {
        // The engine's side too, so results and trigger answers have calls to answer.
        if rng.chance(4) {
            let call = match rng.below(3) {
                0 => json!({"type":"invokefunction","invocation_id":uuid(&mut rng),
                            "function_id":rng.pick(IDS),"data":value(&mut rng, 0)}),
                1 => json!({"type":"registertrigger","id":uuid(&mut rng),"trigger_type":"hook",
                            "function_id":rng.pick(IDS),"config":{}}),
                _ => json!({"type":"invocationresult","invocation_id":uuid(&mut rng),
                            "function_id":rng.pick(IDS),"result":1}),
            };
            let mut out = Vec::new();
            session.judge_engine(&Message::text(call.to_string()), &mut out);
        }
        let bytes = match rng.below(10) {
            0 => (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
            1 => value(&mut rng, 0).to_string().into_bytes(),
            2..=5 => {
                let mut message = valid(&mut rng);
                mutate(&mut rng, &mut message);
                if rng.chance(2) {
                    mutate(&mut rng, &mut message);
                }
                frame(&mut rng, &message)
            }
            _ => {
                let message = valid(&mut rng);
                frame(&mut rng, &message)
            }
        };
        let input = parse_guest(&bytes).ok();
        let message = Message::binary(bytes);
        let mut out = Vec::new();
        let judged = session.judge_guest(&message, &mut out);
        if judged.is_err() {
            assert!(out.is_empty(), "{out:?}");
        }
        for step in &out {
            if let Out::Engine(sent) = step {
                let text = sent.to_text().unwrap();
                check(&session, input.as_ref(), text);
                let kind = serde_json::from_str::<Value>(text).unwrap()["type"].to_string();
                *sent_on.entry(kind).or_default() += 1;
            }
        }
    }
    session.end();
    assert_eq!(session.ctx.functions.load(Ordering::Relaxed), 0);
    sent_on
}

fn at_least(sent_on: &HashMap<String, usize>, kind: &str, n: usize) {
    let got = sent_on.get(&format!("{kind:?}")).copied().unwrap_or(0);
    assert!(got >= n, "only {got} {kind} went on: {sent_on:?}");
}

#[test]
fn whatever_a_sandbox_sends_the_engine_gets_only_validated_messages() {
    let policy = Policy::new(
        &["math::*".to_string(), "guest::*".to_string()],
        &["*".to_string()],
        &["sandbox-libkrun".to_string()],
        &["sandbox-libkrun".to_string()],
    )
    .unwrap();
    let started = std::time::Instant::now();
    let sent_on = run(Session::new(tests_context(policy)), 0x5eed_0001, 20_000);
    for kind in [
        "registerfunction",
        "invokefunction",
        "unregisterfunction",
        "reattach",
    ] {
        at_least(&sent_on, kind, 20);
    }
    at_least(&sent_on, "invocationresult", 1);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn whatever_a_worker_vm_sends_the_engine_gets_only_validated_messages() {
    let policy = Policy::worker_vm(
        &["sandbox-libkrun".to_string()],
        &["sandbox-libkrun".to_string()],
        true,
    );
    let sent_on = run(Session::new(tests_context(policy)), 0x5eed_0002, 20_000);
    for kind in [
        "registerfunction",
        "invokefunction",
        "registertrigger",
        "registertriggertype",
    ] {
        at_least(&sent_on, kind, 20);
    }
}

fn tests_context(policy: Policy) -> Context {
    Context {
        sandbox: Arc::from("fuzz"),
        policy: Arc::new(policy),
        functions: Arc::new(AtomicUsize::new(0)),
        shared: Arc::new(Shared::default()),
    }
}
