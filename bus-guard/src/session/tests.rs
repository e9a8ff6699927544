use serde_json::{json, Value};

use super::*;

fn session(call: &[&str], register: &[&str]) -> Session {
    let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let policy = Policy::new(
        &strings(call),
        &strings(register),
        &strings(&["sandbox-libkrun"]),
        &strings(&["sandbox-libkrun"]),
    )
    .unwrap();
    Session::new(Context {
        sandbox: Arc::from("sb-1"),
        policy: Arc::new(policy),
        functions: Arc::new(AtomicUsize::new(0)),
    })
}

fn text(value: Value) -> Message {
    Message::text(value.to_string())
}

fn guest(s: &mut Session, value: Value) -> Vec<Out> {
    let mut out = Vec::new();
    s.judge_guest(&text(value), &mut out).unwrap();
    out
}

fn engine(s: &mut Session, value: Value) -> Vec<Out> {
    let mut out = Vec::new();
    s.judge_engine(&text(value), &mut out);
    out
}

fn json_of(message: &Message) -> Value {
    serde_json::from_str(message.to_text().unwrap()).unwrap()
}

/// The one message `out` sends the guest.
fn to_guest(out: &[Out]) -> Value {
    match out {
        [Out::Guest(m)] => json_of(m),
        other => panic!("expected one message to the guest, got {other:?}"),
    }
}

fn forwarded(out: &[Out]) -> bool {
    matches!(out, [Out::Engine(_)])
}

#[test]
fn allowed_registrations_go_on_and_are_counted() {
    let mut s = session(&[], &["*"]);
    let out = guest(
        &mut s,
        json!({"type":"registerfunction","id":"guest::hello"}),
    );
    assert!(forwarded(&out));
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 1);
    // The same id again counts once.
    guest(
        &mut s,
        json!({"type":"registerfunction","id":"guest::hello"}),
    );
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 1);
    let out = guest(
        &mut s,
        json!({"type":"unregisterfunction","id":"guest::hello"}),
    );
    assert!(forwarded(&out));
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
    // Unregistering what it never registered goes nowhere.
    let out = guest(&mut s, json!({"type":"unregisterfunction","id":"host::fn"}));
    assert!(out.is_empty());
}

#[test]
fn a_refused_registration_is_answered_as_the_engine_refuses_a_taken_id() {
    let mut s = session(&[], &["*"]);
    let answer = to_guest(&guest(
        &mut s,
        json!({"type":"registerfunction","id":"sandbox-libkrun::create"}),
    ));
    assert_eq!(answer["type"], "registrationrejected");
    assert_eq!(answer["code"], "FUNCTION_NAMESPACE_CONFLICT");
    assert_eq!(answer["function_id"], "sandbox-libkrun::create");
    assert!(answer["owner_worker_id"]
        .as_str()
        .unwrap()
        .contains("sandbox-libkrun::"));
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
}

#[test]
fn the_engines_refusal_of_a_taken_id_is_relayed_and_uncounted() {
    let mut s = session(&[], &["*"]);
    guest(&mut s, json!({"type":"registerfunction","id":"host::fn"}));
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 1);
    let rejected = json!({"type":"registrationrejected","code":"FUNCTION_NAMESPACE_CONFLICT",
        "namespace":"default","function_id":"host::fn","owner_worker_id":"w-1"});
    assert_eq!(to_guest(&engine(&mut s, rejected.clone())), rejected);
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
    // And the engine's calls to it no longer reach the guest.
    let out = engine(
        &mut s,
        json!({"type":"invokefunction","invocation_id":"i-1","function_id":"host::fn","data":{}}),
    );
    assert!(matches!(out.as_slice(), [Out::Engine(_)]));
}

#[test]
fn refused_calls_get_a_named_error_at_once_and_void_ones_vanish() {
    let mut s = session(&["math::*"], &["*"]);
    for (function, rule) in [
        ("sandbox-libkrun::list", "sandbox-libkrun::"),
        ("sandbox::run", "sandbox::"),
        ("configuration::get", "configuration::"),
        ("engine::functions::list", "engine::"),
        ("shell::exec", "sandbox_bus_call"),
    ] {
        let answer = to_guest(&guest(
            &mut s,
            json!({"type":"invokefunction","invocation_id":"c-1","function_id":function,"data":{}}),
        ));
        assert_eq!(answer["type"], "invocationresult");
        assert_eq!(answer["invocation_id"], "c-1");
        assert_eq!(answer["error"]["code"], crate::wire::REFUSED_CODE);
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(rule), "{function}: {message}");
        let void = guest(
            &mut s,
            json!({"type":"invokefunction","function_id":function,"data":{}}),
        );
        assert!(void.is_empty(), "{function}");
    }
    let allowed = guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":"c-2","function_id":"math::add","data":{}}),
    );
    assert!(forwarded(&allowed));
    for sdk in ["engine::workers::register", "engine::channels::create"] {
        let out = guest(
            &mut s,
            json!({"type":"invokefunction","invocation_id":"c-3","function_id":sdk,"data":{"name":"guest"}}),
        );
        assert!(forwarded(&out), "{sdk}");
    }
}

#[test]
fn announcing_the_adapters_name_is_fatal() {
    let mut s = session(&[], &["*"]);
    let out = guest(
        &mut s,
        json!({"type":"invokefunction","function_id":"engine::workers::register",
               "data":{"name":"sandbox-libkrun","namespace":"ns"},"action":{"type":"void"}}),
    );
    match out.as_slice() {
        [Out::Guest(m), Out::Close] => {
            let answer = json_of(m);
            assert_eq!(answer["code"], "WORKER_NAMESPACE_CONFLICT");
            assert_eq!(answer["worker_name"], "sandbox-libkrun");
            assert_eq!(answer["namespace"], "ns");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn only_answers_to_calls_made_to_the_guest_go_back() {
    let mut s = session(&[], &["*"]);
    guest(
        &mut s,
        json!({"type":"registerfunction","id":"guest::hello"}),
    );
    let id = "6f1c3a52-5b8e-4d0c-9a61-2f4d7e2b9c10";
    let out = engine(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id,"function_id":"guest::hello","data":{}}),
    );
    assert!(matches!(out.as_slice(), [Out::Guest(_)]));
    // A forged answer to some other call is dropped.
    let forged = guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":null,"function_id":"x"}),
    );
    assert!(forged.is_empty());
    let other = guest(
        &mut s,
        json!({"type":"invocationresult","invocation_id":"00000000-0000-4000-8000-000000000000","function_id":"host::fn","result":1}),
    );
    assert!(other.is_empty());
    // The real one (printed in upper case, as a client may) goes on, once.
    let answer = json!({"type":"invocationresult","invocation_id":id.to_uppercase(),"function_id":"guest::hello","result":"hi"});
    assert!(forwarded(&guest(&mut s, answer.clone())));
    assert!(guest(&mut s, answer).is_empty());
}

#[test]
fn calls_to_functions_the_guest_does_not_serve_never_reach_it() {
    let mut s = session(&[], &["*"]);
    let out = engine(
        &mut s,
        json!({"type":"invokefunction","invocation_id":"i-9","function_id":"other::fn","data":{"secret":1}}),
    );
    match out.as_slice() {
        [Out::Engine(m)] => assert_eq!(json_of(m)["error"]["code"], crate::wire::REFUSED_CODE),
        other => panic!("{other:?}"),
    }
}

#[test]
fn pings_are_answered_and_unknown_types_dropped_both_ways() {
    let mut s = session(&[], &["*"]);
    assert_eq!(
        to_guest(&guest(&mut s, json!({"type":"ping"})))["type"],
        "pong"
    );
    for dropped in [
        json!({"type":"registertrigger","id":"t","trigger_type":"http","function_id":"sandbox::run","config":{}}),
        json!({"type":"registertriggertype","id":"http","description":""}),
        json!({"type":"observe","id":"o","source":{},"target":{}}),
        json!({"type":"somethingnew"}),
        json!({"type":"pong"}),
    ] {
        assert!(guest(&mut s, dropped.clone()).is_empty(), "{dropped}");
        assert!(engine(&mut s, dropped.clone()).is_empty(), "{dropped}");
    }
    let reattach = json!({"type":"reattach","previous_worker_id":"w","reattach_token":"t"});
    assert!(forwarded(&guest(&mut s, reattach)));
    let greeting = to_guest(&engine(
        &mut s,
        json!({"type":"workerregistered","worker_id":"w","features":["observe.v1","local-dispatch.v1"]}),
    ));
    assert!(greeting.get("features").is_none());
}

#[test]
fn malformed_messages_end_the_connection() {
    let mut s = session(&[], &["*"]);
    let mut out = Vec::new();
    for bad in [
        Message::text("not json"),
        Message::text("[1,2]"),
        Message::text(r#"{"no":"type"}"#),
        Message::text(r#"{"type":"registerfunction"}"#),
        Message::text(r#"{"type":"invokefunction","invocation_id":5,"function_id":"x"}"#),
        Message::text(
            r#"{"type":"invokefunction","function_id":"a","function_id":"sandbox::run"}"#,
        ),
        Message::binary(vec![0xff, 0x00]),
    ] {
        assert!(s.judge_guest(&bad, &mut out).is_err(), "{bad:?}");
    }
    assert!(out.is_empty());
}

#[test]
fn the_bounds_refuse_by_name() {
    let mut s = session(&["*"], &["*"]);
    for n in 0..MAX_FUNCTIONS {
        guest(
            &mut s,
            json!({"type":"registerfunction","id":format!("f::{n}")}),
        );
    }
    let answer = to_guest(&guest(
        &mut s,
        json!({"type":"registerfunction","id":"f::one-more"}),
    ));
    assert!(answer["owner_worker_id"]
        .as_str()
        .unwrap()
        .contains("at most"));
    for n in 0..MAX_CALLS_IN_FLIGHT {
        guest(
            &mut s,
            json!({"type":"invokefunction","invocation_id":format!("c-{n}"),"function_id":"math::add"}),
        );
    }
    let answer = to_guest(&guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":"c-x","function_id":"math::add"}),
    ));
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("awaiting"));
    // An answer frees a place.
    engine(
        &mut s,
        json!({"type":"invocationresult","invocation_id":"c-0","function_id":"math::add","result":1}),
    );
    assert!(forwarded(&guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":"c-y","function_id":"math::add"}),
    )));
    s.end();
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
}
