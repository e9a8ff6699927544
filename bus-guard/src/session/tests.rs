use serde_json::{json, Value};

use super::*;
use crate::limits::LOGGED_REFUSALS;

fn strings(l: &[&str]) -> Vec<String> {
    l.iter().map(|s| s.to_string()).collect()
}

fn context(policy: Policy) -> Context {
    Context {
        sandbox: Arc::from("sb-1"),
        policy: Arc::new(policy),
        functions: Arc::new(AtomicUsize::new(0)),
        shared: Arc::new(Shared::default()),
    }
}

fn sandbox_policy(call: &[&str], register: &[&str]) -> Policy {
    Policy::new(
        &strings(call),
        &strings(register),
        &strings(&["sandbox-libkrun"]),
        &strings(&["sandbox-libkrun"]),
    )
    .unwrap()
}

fn session(call: &[&str], register: &[&str]) -> Session {
    Session::new(context(sandbox_policy(call, register)))
}

fn worker_session(http: bool) -> Session {
    let policy = Policy::worker_vm(
        &strings(&["sandbox-libkrun"]),
        &strings(&["sandbox-libkrun"]),
        http,
    )
    .with_namespace("shop");
    Session::new(context(policy))
}

/// A UUID of its own per `n`, as the SDKs make invocation ids.
fn id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

fn text(value: Value) -> Message {
    Message::text(value.to_string())
}

fn guest(s: &mut Session, value: Value) -> Vec<Out> {
    let mut out = Vec::new();
    s.judge_guest(&text(value), &mut out).unwrap();
    out
}

fn guest_err(s: &mut Session, value: Value) -> Malformed {
    let mut out = Vec::new();
    let error = s.judge_guest(&text(value), &mut out).unwrap_err();
    assert!(out.is_empty(), "{out:?}");
    error
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

/// The one message `out` sends the engine.
fn to_engine(out: &[Out]) -> Value {
    match out {
        [Out::Engine(m)] => json_of(m),
        other => panic!("expected one message to the engine, got {other:?}"),
    }
}

fn forwarded(out: &[Out]) -> bool {
    matches!(out, [Out::Engine(_)])
}

/// A fatal worker refusal: the `registrationrejected` sent, then the close.
fn fatal(out: &[Out]) -> Value {
    match out {
        [Out::Guest(m), Out::Close] => json_of(m),
        other => panic!("expected a fatal refusal, got {other:?}"),
    }
}

fn announce(s: &mut Session, data: Value) -> Vec<Out> {
    guest(
        s,
        json!({"type":"invokefunction","function_id":"engine::workers::register",
               "data":data,"action":{"type":"void"}}),
    )
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
fn what_goes_on_is_the_guards_own_serialisation() {
    let mut s = session(&["math::*"], &["*"]);
    // Escapes, spacing, key order and a decomposed accent: the engine gets the guard's text.
    let frame = "{ \"id\" : \"guest::\\u0063af\u{e9}\", \"type\":\"registerfunction\",\n \"description\":\"cafe\u{301}\", \"observe\":{\"allow\":true} }";
    let mut out = Vec::new();
    s.judge_guest(&Message::text(frame), &mut out).unwrap();
    let Out::Engine(sent) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(
        sent.to_text().unwrap(),
        r#"{"type":"registerfunction","id":"guest::café","description":"café"}"#
    );
    let out = guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(1).to_uppercase(),"function_id":"math::add",
               "data":[1,2],"caller":{"worker_id":"forged"}}),
    );
    assert_eq!(
        to_engine(&out),
        json!({"type":"invokefunction","invocation_id":id(1),"function_id":"math::add","data":[1,2]})
    );
}

#[test]
fn a_refused_registration_is_answered_as_the_engine_refuses_a_taken_id() {
    let mut s = session(&[], &["*"]);
    for reserved in [
        "sandbox-libkrun::create",
        "SANDBOX-LIBKRUN::create",
        "ｅｎｇｉｎｅ::x",
    ] {
        let answer = to_guest(&guest(
            &mut s,
            json!({"type":"registerfunction","id":reserved}),
        ));
        assert_eq!(answer["type"], "registrationrejected");
        assert_eq!(answer["code"], "FUNCTION_NAMESPACE_CONFLICT");
        assert_eq!(answer["function_id"], reserved);
        assert!(answer["owner_worker_id"]
            .as_str()
            .unwrap()
            .contains("refused by the sandbox bus guard"));
    }
    // An id not in NFC: the guard cannot re-write it, the guest's SDK knows it as sent.
    for invisible in [
        "guest::a\u{202e}b",
        "guest::\u{200b}x",
        "guest::a b",
        "",
        "guest::cafe\u{301}",
    ] {
        let answer = to_guest(&guest(
            &mut s,
            json!({"type":"registerfunction","id":invisible}),
        ));
        assert_eq!(answer["type"], "registrationrejected", "{invisible:?}");
    }
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
}

#[test]
fn the_engines_refusal_is_relayed_without_the_owners_id() {
    let mut s = session(&[], &["*"]);
    guest(&mut s, json!({"type":"registerfunction","id":"host::fn"}));
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 1);
    let owner = "6f1c3a52-5b8e-4d0c-9a61-2f4d7e2b9c10";
    let answer = to_guest(&engine(
        &mut s,
        json!({"type":"registrationrejected","code":"FUNCTION_NAMESPACE_CONFLICT",
               "namespace":"default","function_id":"host::fn","owner_worker_id":owner}),
    ));
    assert_eq!(answer["code"], "FUNCTION_NAMESPACE_CONFLICT");
    assert_eq!(answer["function_id"], "host::fn");
    assert!(!answer.to_string().contains(owner), "{answer}");
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
    // And the engine's calls to it no longer reach the guest.
    let out = engine(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(1),"function_id":"host::fn","data":{}}),
    );
    assert!(forwarded(&out));
    // The worker conflict, too.
    let answer = to_guest(&engine(
        &mut s,
        json!({"type":"registrationrejected","code":"WORKER_NAMESPACE_CONFLICT",
               "namespace":"default","worker_name":"w","owner_worker_id":owner}),
    ));
    assert!(!answer.to_string().contains(owner), "{answer}");
}

#[test]
fn refused_calls_get_a_named_error_at_once_and_void_ones_vanish() {
    let mut s = session(&["math::*"], &["*"]);
    for (function, rule) in [
        ("sandbox-libkrun::list", "sandbox-libkrun::"),
        ("sandbox::run", "sandbox::"),
        ("configuration::get", "configuration::"),
        ("engine::functions::list", "engine::"),
        ("engine::workers::list", "engine::"),
        ("shell::exec", "sandbox_bus_call"),
    ] {
        let answer = to_guest(&guest(
            &mut s,
            json!({"type":"invokefunction","invocation_id":id(1),"function_id":function,"data":{}}),
        ));
        assert_eq!(answer["type"], "invocationresult");
        assert_eq!(answer["invocation_id"], id(1));
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
        json!({"type":"invokefunction","invocation_id":id(2),"function_id":"math::add","data":{}}),
    );
    assert!(forwarded(&allowed));
    // The Rust SDK names `default` for the engine's own functions.
    let channel = guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(3),"function_id":"engine::channels::create",
               "data":{"buffer_size":4},"namespace":"default"}),
    );
    assert_eq!(to_engine(&channel)["data"], json!({"buffer_size":4}));
    let channel = guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(4),"function_id":"engine::channels::create",
               "data":{"buffer_size":null}}),
    );
    assert_eq!(to_engine(&channel)["data"], json!({}));
}

/// Attack 1: a control-character variant of the adapter's name, a duplicated `name`, and
/// array data read positionally as `_caller_worker_id`.
#[test]
fn the_adapters_name_under_any_variant_is_fatal() {
    for name in [
        "sandbox-libkrun",
        "sandbox-libkrun\u{7}",
        "\u{1b}sandbox-libkrun",
        "sandbox-libkrun\u{202e}",
        "Sandbox-LibKrun",
        "\u{ff53}andbox-libkrun",
        " sandbox-libkrun",
    ] {
        let mut s = session(&[], &["*"]);
        let answer = fatal(&announce(&mut s, json!({"name": name, "runtime": "rust"})));
        assert_eq!(answer["code"], "WORKER_NAMESPACE_CONFLICT", "{name:?}");
        assert_eq!(answer["worker_name"], name);
    }
    let mut s = session(&[], &["*"]);
    let twice = r#"{"type":"invokefunction","function_id":"engine::workers::register","data":{"name":"ok","name":"sandbox-libkrun"}}"#;
    let mut out = Vec::new();
    assert!(s.judge_guest(&Message::text(twice), &mut out).is_err());
    assert!(out.is_empty());
    // Array data (the engine would read its first element as the caller's worker id), and
    // any underscore field, are refused and end the connection.
    for data in [
        json!([
            "6f1c3a52-5b8e-4d0c-9a61-2f4d7e2b9c10",
            "runtime",
            "1",
            "evil"
        ]),
        json!("sandbox-libkrun"),
        json!(null),
        json!({"name":"ok","_caller_worker_id":"6f1c3a52-5b8e-4d0c-9a61-2f4d7e2b9c10"}),
        json!({"name":"ok","secret":1}),
    ] {
        let mut s = session(&[], &["*"]);
        let answer = fatal(&announce(&mut s, data.clone()));
        assert_eq!(answer["code"], "WORKER_NAMESPACE_CONFLICT", "{data}");
    }
}

#[test]
fn an_announcement_is_rebuilt_from_its_validated_fields() {
    let mut s = session(&[], &["*"]);
    // As the Python SDK sends it: absent values as null, an analytics key, trace context.
    let out = guest(
        &mut s,
        json!({"type":"invokefunction","function_id":"engine::workers::register",
               "traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
               "action":{"type":"void"},
               "data":{"runtime":"python","version":"0.23.0","name":"code-runner:42","os":"Linux 6.1 (x86_64)",
                       "pid":42,"isolation":null,"namespace":null,
                       "telemetry":{"language":"en_US","project_name":"p","framework":"iii-py","amplitude_api_key":"k"},
                       "features":["observe.v1","large-messages.v1"]}}),
    );
    let sent = to_engine(&out);
    assert_eq!(sent["function_id"], "engine::workers::register");
    assert_eq!(
        sent["data"],
        json!({"runtime":"python","version":"0.23.0","name":"code-runner:42","os":"Linux 6.1 (x86_64)",
               "pid":42,"telemetry":{"language":"en_US","project_name":"p","framework":"iii-py"},
               "features":["large-messages.v1"]})
    );
    assert!(sent.get("invocation_id").is_none());
}

/// Attack 2: an HTTP-invoked function, which the engine would call from the host with a
/// bearer token from an environment variable the guest names.
#[test]
fn http_invoked_functions_are_refused_by_rule() {
    let registration = json!({"type":"registerfunction","id":"guest::lambda",
        "invocation":{"url":"http://169.254.169.254/latest","method":"POST",
                      "auth":{"type":"bearer","token_key":"AWS_SECRET_ACCESS_KEY"}}});
    let mut s = session(&[], &["*"]);
    let answer = to_guest(&guest(&mut s, registration.clone()));
    assert_eq!(answer["type"], "registrationrejected");
    assert!(answer["owner_worker_id"]
        .as_str()
        .unwrap()
        .contains("http function"));
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
    // A worker VM without the operator's leave: refused too; with it, never with `auth`.
    let mut w = worker_session(false);
    assert!(
        to_guest(&guest(&mut w, registration.clone()))["owner_worker_id"]
            .as_str()
            .unwrap()
            .contains("http function")
    );
    let mut w = worker_session(true);
    assert!(to_guest(&guest(&mut w, registration))["owner_worker_id"]
        .as_str()
        .unwrap()
        .contains("http auth"));
    let plain = json!({"type":"registerfunction","id":"guest::lambda",
        "invocation":{"url":"https://example.com/invoke","method":"POST","timeout_ms":3000}});
    assert_eq!(to_engine(&guest(&mut w, plain.clone())), plain);
}

/// Attack 3: registrations heavy with schemas, and channel floods.
#[test]
fn registration_bytes_and_channels_are_bounded() {
    let mut s = session(&[], &["*"]);
    let big = "x".repeat(MAX_REGISTRATION_BYTES);
    let answer = to_guest(&guest(
        &mut s,
        json!({"type":"registerfunction","id":"guest::big","request_format":{"description":big}}),
    ));
    assert!(answer["owner_worker_id"]
        .as_str()
        .unwrap()
        .contains("at most 65536 bytes"));
    let part = "x".repeat(MAX_REGISTRATION_BYTES - 100);
    let fits = MAX_CONNECTION_REGISTRATION_BYTES / (MAX_REGISTRATION_BYTES - 50);
    for n in 0..fits {
        let out = guest(
            &mut s,
            json!({"type":"registerfunction","id":format!("guest::f{n}"),"metadata":{"x":part}}),
        );
        assert!(forwarded(&out), "{n}");
    }
    let answer = to_guest(&guest(
        &mut s,
        json!({"type":"registerfunction","id":"guest::more","metadata":{"x":part}}),
    ));
    assert!(answer["owner_worker_id"]
        .as_str()
        .unwrap()
        .contains("a connection's registrations"));
    // Unregistering frees its bytes.
    guest(
        &mut s,
        json!({"type":"unregisterfunction","id":"guest::f0"}),
    );
    assert!(forwarded(&guest(
        &mut s,
        json!({"type":"registerfunction","id":"guest::more","metadata":{"x":part}}),
    )));

    // Channels: the burst passes, the next is refused by name, in another connection of the
    // same sandbox too.
    let ctx = context(sandbox_policy(&[], &["*"]));
    let mut first = Session::new(ctx.clone());
    for n in 0..crate::limits::CHANNEL_RATE {
        let out = guest(
            &mut first,
            json!({"type":"invokefunction","function_id":"engine::channels::create","data":{},"invocation_id":id(n)}),
        );
        assert!(forwarded(&out), "{n}");
    }
    let mut second = Session::new(ctx);
    let answer = to_guest(&guest(
        &mut second,
        json!({"type":"invokefunction","function_id":"engine::channels::create","data":{},"invocation_id":id(999)}),
    ));
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("channels a second"));
    // A void one is refused silently; bad requests by rule.
    assert!(guest(
        &mut second,
        json!({"type":"invokefunction","function_id":"engine::channels::create","data":{}}),
    )
    .is_empty());
    let mut s = session(&[], &["*"]);
    for data in [
        json!({"buffer_size": MAX_CHANNEL_BUFFER + 1}),
        json!([4]),
        json!({"buffer_size": 4, "_caller_worker_id": "x"}),
    ] {
        let answer = to_guest(&guest(
            &mut s,
            json!({"type":"invokefunction","function_id":"engine::channels::create","data":data,"invocation_id":id(1)}),
        ));
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("channel request"),
            "{data}"
        );
    }
}

/// Attack 4: refusal churn, across reconnects, logs a bounded number of lines.
#[test]
fn the_refusal_log_is_shared_by_a_sandboxs_connections() {
    let ctx = context(sandbox_policy(&[], &["*"]));
    for _ in 0..(LOGGED_REFUSALS + 10) {
        let mut s = Session::new(ctx.clone());
        guest(
            &mut s,
            json!({"type":"invokefunction","function_id":"sandbox::run","invocation_id":id(1)}),
        );
        s.end();
    }
    // A fresh connection of the same sandbox finds the rule's budget spent.
    let verdict = ctx
        .shared
        .log
        .lock()
        .unwrap()
        .note("invokefunction: reserved:sandbox::", Instant::now());
    assert_eq!(verdict, LogLine::Quiet);
}

/// Attack 5: namespaces.
#[test]
fn a_sandbox_acts_in_the_default_namespace_only() {
    let mut s = session(&["math::*"], &["*"]);
    let answer = to_guest(&guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(1),"function_id":"math::add","namespace":"tenant-b"}),
    ));
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("namespace"));
    let out = guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(2),"function_id":"math::add","namespace":"default"}),
    );
    assert!(forwarded(&out));
    let answer = fatal(&announce(
        &mut s,
        json!({"name":"guest","namespace":"tenant-b"}),
    ));
    assert_eq!(answer["code"], "WORKER_NAMESPACE_CONFLICT");
    // A worker VM may name its own namespace as well.
    let mut w = worker_session(false);
    assert!(forwarded(&announce(
        &mut w,
        json!({"name":"worker-a","namespace":"shop"})
    )));
    assert!(fatal(&announce(
        &mut w,
        json!({"name":"worker-a","namespace":"other"})
    ))["code"]
        .is_string());
}

#[test]
fn only_answers_to_calls_made_to_the_guest_go_back() {
    let mut s = session(&[], &["*"]);
    guest(
        &mut s,
        json!({"type":"registerfunction","id":"guest::hello"}),
    );
    let call = id(7);
    let out = engine(
        &mut s,
        json!({"type":"invokefunction","invocation_id":call,"function_id":"guest::hello",
               "data":{"x":1,"_caller_worker_id":"6f1c3a52-5b8e-4d0c-9a61-2f4d7e2b9c10"},
               "caller":{"worker_id":"w"}}),
    );
    // The caller's identity stays with the engine.
    assert_eq!(
        to_guest(&out),
        json!({"type":"invokefunction","invocation_id":call,"function_id":"guest::hello","data":{"x":1}})
    );
    let other = guest(
        &mut s,
        json!({"type":"invocationresult","invocation_id":id(8),"function_id":"host::fn","result":1}),
    );
    assert!(other.is_empty());
    // The real one (printed in upper case, as a client may) goes on, once, under the id of
    // the function called.
    let answer = json!({"type":"invocationresult","invocation_id":call.to_uppercase(),"function_id":"host::fn","result":"hi"});
    assert_eq!(
        to_engine(&guest(&mut s, answer.clone())),
        json!({"type":"invocationresult","invocation_id":call,"function_id":"guest::hello","result":"hi"})
    );
    assert!(guest(&mut s, answer).is_empty());
}

#[test]
fn calls_to_functions_the_guest_does_not_serve_never_reach_it() {
    let mut s = session(&[], &["*"]);
    let out = engine(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(9),"function_id":"other::fn","data":{"secret":1}}),
    );
    assert_eq!(to_engine(&out)["error"]["code"], crate::wire::REFUSED_CODE);
}

#[test]
fn results_reach_only_the_guest_that_called() {
    let mut s = session(&["math::*"], &["*"]);
    guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(1),"function_id":"math::add"}),
    );
    let stray = engine(
        &mut s,
        json!({"type":"invocationresult","invocation_id":id(2),"function_id":"math::add","result":1}),
    );
    assert!(stray.is_empty());
    let mine = engine(
        &mut s,
        json!({"type":"invocationresult","invocation_id":id(1),"function_id":"math::add","result":1,"extra":"x"}),
    );
    assert_eq!(
        to_guest(&mine),
        json!({"type":"invocationresult","invocation_id":id(1),"function_id":"math::add","result":1})
    );
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
    let reattach = json!({"type":"reattach","previous_worker_id":id(1),"reattach_token":id(2)});
    assert_eq!(to_engine(&guest(&mut s, reattach.clone())), reattach);
    let greeting = to_guest(&engine(
        &mut s,
        json!({"type":"workerregistered","worker_id":"w","features":["observe.v1","local-dispatch.v1"]}),
    ));
    assert_eq!(greeting, json!({"type":"workerregistered","worker_id":"w"}));
}

#[test]
fn malformed_messages_end_the_connection() {
    let mut s = session(&["*"], &["*"]);
    let mut out = Vec::new();
    for bad in [
        Message::text("not json"),
        Message::text("[1,2]"),
        Message::text(r#"{"no":"type"}"#),
        Message::text(r#"{"type":7}"#),
        Message::text(r#"{"type":"registerfunction"}"#),
        Message::text(r#"{"type":"registerfunction","id":"a","invocation":"x"}"#),
        Message::text(r#"{"type":"invokefunction","invocation_id":5,"function_id":"x"}"#),
        Message::text(r#"{"type":"invokefunction","invocation_id":"c-1","function_id":"x"}"#),
        Message::text(
            r#"{"type":"invokefunction","function_id":"a","function_id":"sandbox::run"}"#,
        ),
        Message::text(r#"{"type":"invokefunction","function_id":"a","data":{"k":1,"k":2}}"#),
        Message::text(r#"{"type":"invokefunction","function_id":"a","activation":{}}"#),
        Message::text(r#"{"type":"invokefunction","function_id":"a","traceparent":"x"}"#),
        Message::text(r#"{"type":"invokefunction","function_id":"a","baggage":"a\u0000"}"#),
        Message::text(r#"{"type":"reattach","previous_worker_id":"a\u202e"}"#),
        Message::binary(vec![0xff, 0x00]),
    ] {
        assert!(s.judge_guest(&bad, &mut out).is_err(), "{bad:?}");
    }
    assert!(out.is_empty());
    // A reused invocation id would make two results one.
    guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(1),"function_id":"math::add"}),
    );
    let again = guest_err(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(1),"function_id":"math::add"}),
    );
    assert_eq!(again.kind, "invokefunction");
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
    for n in 0..MAX_CALLS_IN_FLIGHT as u32 {
        guest(
            &mut s,
            json!({"type":"invokefunction","invocation_id":id(n),"function_id":"math::add"}),
        );
    }
    let answer = to_guest(&guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(100_000),"function_id":"math::add"}),
    ));
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("awaiting"));
    // An answer frees a place.
    engine(
        &mut s,
        json!({"type":"invocationresult","invocation_id":id(0),"function_id":"math::add","result":1}),
    );
    assert!(forwarded(&guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(100_001),"function_id":"math::add"}),
    )));
    s.end();
    assert_eq!(s.ctx.functions.load(Ordering::Relaxed), 0);
}

#[test]
fn a_worker_vm_registers_and_calls_openly_but_never_reserved_ids() {
    let mut w = worker_session(false);
    assert!(forwarded(&guest(
        &mut w,
        json!({"type":"registerfunction","id":"orders::create"})
    )));
    for reserved in [
        "sandbox-libkrun::x",
        "engine::x",
        "sandbox::run",
        "configuration::get",
    ] {
        let answer = to_guest(&guest(
            &mut w,
            json!({"type":"registerfunction","id":reserved}),
        ));
        assert_eq!(answer["type"], "registrationrejected", "{reserved}");
    }
    for open in [
        "anything::at_all",
        "sandbox::run",
        "sandbox-libkrun::create",
        "configuration::get",
    ] {
        assert!(
            forwarded(&guest(
                &mut w,
                json!({"type":"invokefunction","function_id":open,"data":{}})
            )),
            "{open}"
        );
    }
    for closed in [
        "engine::functions::list",
        "engine::workers::list",
        "ENGINE::x",
    ] {
        assert!(
            guest(
                &mut w,
                json!({"type":"invokefunction","function_id":closed,"data":{}})
            )
            .is_empty(),
            "{closed}"
        );
    }
    // The engine's environment is not a worker's to read through configuration values.
    let answer = to_guest(&guest(
        &mut w,
        json!({"type":"invokefunction","invocation_id":id(1),"function_id":"configuration::set",
               "data":{"id":"x","value":{"k":"${AWS_SECRET_ACCESS_KEY}"}}}),
    ));
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("configuration placeholder"));
    // Queues are a worker's to use.
    assert!(forwarded(&guest(
        &mut w,
        json!({"type":"invokefunction","invocation_id":id(2),"function_id":"orders::create",
               "action":{"type":"enqueue","queue":"orders"},"namespace":"shop"})
    )));
    // Not a sandbox's.
    let mut s = session(&["*"], &["*"]);
    assert!(to_guest(&guest(
        &mut s,
        json!({"type":"invokefunction","invocation_id":id(2),"function_id":"orders::create",
               "action":{"type":"enqueue","queue":"orders"}})
    ))["error"]["message"]
        .as_str()
        .unwrap()
        .contains("enqueue"));
}

#[test]
fn a_worker_vm_binds_and_provides_triggers() {
    let mut w = worker_session(false);
    guest(
        &mut w,
        json!({"type":"registerfunction","id":"orders::tick"}),
    );
    // As the Node SDK sends it, with its own `message_type` beside `type`.
    let trigger = json!({"type":"registertrigger","id":id(1),"trigger_type":"cron","message_type":"registertrigger",
        "function_id":"orders::tick","config":{"expression":"* * * * *"},"namespace":"shop"});
    assert_eq!(
        to_engine(&guest(&mut w, trigger)),
        json!({"type":"registertrigger","id":id(1),"trigger_type":"cron",
        "function_id":"orders::tick","config":{"expression":"* * * * *"},"namespace":"shop"})
    );
    // The engine's answer reaches it; another trigger's does not.
    let result = json!({"type":"triggerregistrationresult","id":id(1),"trigger_type":"cron","function_id":"orders::tick"});
    assert_eq!(
        to_guest(&engine(&mut w, result)),
        json!({"type":"triggerregistrationresult","id":id(1),"trigger_type":"cron","function_id":"orders::tick"})
    );
    assert!(engine(
        &mut w,
        json!({"type":"triggerregistrationresult","id":id(9),"trigger_type":"cron","function_id":"x"})
    )
    .is_empty());
    // A trigger on a reserved function is answered with the refusal.
    let answer = to_guest(&guest(
        &mut w,
        json!({"type":"registertrigger","id":id(2),"trigger_type":"http","function_id":"sandbox-libkrun::create","config":{}}),
    ));
    assert_eq!(answer["type"], "triggerregistrationresult");
    assert_eq!(answer["error"]["code"], crate::wire::REFUSED_CODE);
    // As the Python SDK may send it, without its type: the guard knows it.
    assert_eq!(
        to_engine(&guest(
            &mut w,
            json!({"type":"unregistertrigger","id":id(1)})
        )),
        json!({"type":"unregistertrigger","id":id(1),"trigger_type":"cron"})
    );
    assert!(guest(
        &mut w,
        json!({"type":"unregistertrigger","id":id(2),"trigger_type":"http"})
    )
    .is_empty());

    // Providing a type: the engine asks for bindings, the worker answers for those only.
    let provide = json!({"type":"registertriggertype","id":"webhook","description":"hooks"});
    assert_eq!(to_engine(&guest(&mut w, provide.clone())), provide);
    let bind = json!({"type":"registertrigger","id":id(3),"trigger_type":"webhook",
        "function_id":"other::fn","config":{"path":"/x"},"trigger_namespace":"shop"});
    assert_eq!(to_guest(&engine(&mut w, bind))["function_id"], "other::fn");
    let answer = json!({"type":"triggerregistrationresult","id":id(3),"trigger_type":"webhook","function_id":"forged::fn"});
    assert_eq!(
        to_engine(&guest(&mut w, answer))["function_id"],
        "other::fn"
    );
    let stray = json!({"type":"triggerregistrationresult","id":id(4),"trigger_type":"webhook","function_id":"x"});
    assert!(guest(&mut w, stray).is_empty());
    // The Node SDK sends the whole registration to unregister a type; only its id goes on.
    let unprovide = json!({"type":"unregistertriggertype","id":"webhook","description":"hooks"});
    assert_eq!(
        to_engine(&guest(&mut w, unprovide)),
        json!({"type":"unregistertriggertype","id":"webhook"})
    );
}
