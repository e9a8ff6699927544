//! iii's sandbox family end to end on the bwrap backend, and on the libkrun plugin's microVMs
//! where `SANDBOX_E2E_PLUGIN=libkrun` (the VM lab runs it so): a caller reaches the adapter through
//! a `sandbox` router (our stand-in, `family_support`, written from the ABI), which calls
//! `sandbox::provider::<name>::*`. The whole ABI v0 flow (create, exec with args, cwd and env,
//! list, fs write and read of binary bytes with a mode, snapshot and a create from it, branch,
//! expose_port, stop twice and of ids nothing runs under); `capabilities[]` against what the
//! engine lists; the adapter never registering a bare `sandbox::<leaf>`; errors keeping our
//! S-code; and the provider name: `local` makes the adapter the router's default, empty turns the surface off,
//! a malformed one is refused at start-up (exit 2). And a caller written with the official
//! Python SDK (`family_caller.py`, where pip can install it) through the same router.

mod family_support;

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use e2e_tests::{bwrap_usable, call_timeout, Adapter, AdapterOptions, RemoteError, Stack};
use serde_json::{json, Value};

const FAMILY_NAME_ENV: &str = "SANDBOX_LIBKRUN_FAMILY_NAME";

/// Whether the libkrun plugin's microVMs are under test (`SANDBOX_E2E_PLUGIN=libkrun`, as
/// the VM lab runs this file): the same flow, every sandbox a microVM.
fn libkrun_under_test() -> bool {
    std::env::var("SANDBOX_E2E_PLUGIN").is_ok_and(|p| p == "libkrun")
}

/// Whether `test` can run here: bwrap where it is usable (else it says it did not run); the
/// libkrun plugin must boot where it is the plugin under test, never skip.
fn usable(test: &str) -> bool {
    libkrun_under_test() || bwrap_usable(test)
}

fn options(family_name: Option<&str>) -> AdapterOptions {
    let mut options = AdapterOptions::default();
    if libkrun_under_test() {
        options.plugin = e2e_tests::PluginKind::Libkrun;
        options.prefix = None;
    }
    if let Some(name) = family_name {
        options.env.push((FAMILY_NAME_ENV.into(), name.into()));
    }
    options
}

/// Calls `sandbox::<leaf>` through the router.
async fn routed(stack: &Stack, leaf: &str, payload: Value) -> Result<Value, RemoteError> {
    stack
        .client
        .invoke(&format!("sandbox::{leaf}"), payload, call_timeout())
        .await
}

/// `sandbox::<leaf>` with `provider` set, which must succeed.
async fn ok(stack: &Stack, provider: &str, leaf: &str, payload: Value) -> Value {
    let mut payload = payload;
    payload["provider"] = json!(provider);
    let shown = payload.to_string();
    routed(stack, leaf, payload)
        .await
        .unwrap_or_else(|e| panic!("sandbox::{leaf} {shown}: {e:?}\n{}", stack.adapter.log()))
}

/// The function ids the engine lists under `prefix`.
async fn listed(stack: &Stack, prefix: &str) -> Vec<String> {
    let list = stack
        .client
        .invoke(
            "engine::functions::list",
            json!({"prefix": prefix}),
            call_timeout(),
        )
        .await
        .expect("engine::functions::list");
    list["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .filter_map(|f| f["function_id"].as_str().map(str::to_string))
        .collect()
}

/// The ABI's optional capabilities whose functions the engine lists under `prefix`.
fn registered_capabilities(ids: &[String], prefix: &str) -> BTreeSet<String> {
    let has = |leaf: &str| ids.iter().any(|id| *id == format!("{prefix}{leaf}"));
    let mut capabilities = BTreeSet::new();
    if has("fs::read") && has("fs::write") {
        capabilities.insert("fs".to_string());
    }
    for leaf in ["snapshot", "branch", "expose_port"] {
        if has(leaf) {
            capabilities.insert(leaf.to_string());
        }
    }
    capabilities
}

async fn wait_for(stack: &Stack, function_id: &str) {
    stack
        .client
        .wait_for_function(function_id, None, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{function_id} did not register: {e:?}"));
}

/// Reads `path` of `id` through the family's `fs::read`.
async fn read_bytes(stack: &Stack, id: &str, path: &str) -> Vec<u8> {
    let read = ok(
        stack,
        "libkrun",
        "fs::read",
        json!({"sandbox_id": id, "path": path}),
    )
    .await;
    base64::engine::general_purpose::STANDARD
        .decode(read["bytes_base64"].as_str().expect("bytes_base64"))
        .expect("base64")
}

/// `GET path` of `url` (`http://host:port`), retried for 20 s while the server starts (five
/// times as long on libkrun: the VM lab's microVMs run under emulation).
async fn http_get(url: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let mut last = String::new();
    let wait = Duration::from_secs(if libkrun_under_test() { 100 } else { 20 });
    let deadline = std::time::Instant::now() + wait;
    while std::time::Instant::now() < deadline {
        match tokio::net::TcpStream::connect(address).await {
            Ok(mut stream) => {
                let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
                let mut answer = String::new();
                let sent = stream.write_all(request.as_bytes()).await;
                let read = stream.read_to_string(&mut answer).await;
                if sent.is_ok() && read.is_ok() && answer.starts_with("HTTP/1.0 200") {
                    return answer;
                }
                last = format!("{sent:?} {read:?} {answer}");
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("GET {url}{path}: {last}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_abi_flow_through_the_router() {
    if !usable("the_abi_flow_through_the_router") {
        return;
    }
    let stack = Stack::start(json!({}), options(None)).await;
    let prefix = "sandbox::provider::libkrun::";
    wait_for(&stack, &format!("{prefix}create")).await;
    // Before any router: the adapter serves nothing under the bare `sandbox::` but the
    // family's provider ids.
    let bare: Vec<String> = listed(&stack, "sandbox::")
        .await
        .into_iter()
        .filter(|id| !id.starts_with("sandbox::provider::"))
        .collect();
    assert!(bare.is_empty(), "bare sandbox:: ids registered: {bare:?}");
    let family_ids = listed(&stack, prefix).await;
    for ours in [
        "pause",
        "metrics",
        "fs::grep",
        "snapshot::list",
        "adapter::info",
    ] {
        assert!(
            family_ids.contains(&format!("{prefix}{ours}")),
            "{ours} missing under the family prefix: {family_ids:?}"
        );
    }
    assert!(
        !family_ids.iter().any(|id| id.contains("::worker::")),
        "{family_ids:?}"
    );

    let router = family_support::start(&stack.engine.url(), "local");
    for leaf in family_support::LEAVES {
        wait_for(&stack, &format!("sandbox::{leaf}")).await;
    }

    // create: the ABI's reply, capabilities exactly the optional leaves registered.
    let created = ok(&stack, "libkrun", "create", json!({"image": "python"})).await;
    let id = created["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();
    assert_eq!(created["image"], "python");
    let started_at = created["started_at"].as_str().expect("started_at");
    assert!(
        started_at.len() >= 20 && started_at.as_bytes()[10] == b'T' && started_at.ends_with('Z'),
        "started_at is not RFC 3339 UTC: {started_at}"
    );
    let announced: BTreeSet<String> = created["capabilities"]
        .as_array()
        .expect("capabilities")
        .iter()
        .map(|c| c.as_str().expect("a capability is a string").to_string())
        .collect();
    assert_eq!(
        announced,
        registered_capabilities(&family_ids, prefix),
        "capabilities against {family_ids:?}"
    );
    assert!(
        announced.contains("fs") && announced.contains("snapshot") && announced.contains("branch")
    );

    // exec: cmd + args, cwd as the working directory, env.
    let ran = ok(
        &stack,
        "libkrun",
        "exec",
        json!({"sandbox_id": id, "cmd": "sh", "args": ["-c", "pwd; echo \"$GREETING\""],
               "cwd": "/tmp", "env": {"GREETING": "hello family"}}),
    )
    .await;
    assert_eq!(ran["stdout"], "/tmp\nhello family\n", "{ran}");
    assert_eq!(ran["exit_code"], 0);
    assert_eq!(ran["timed_out"], false);
    assert_eq!(ran["stderr"], "");

    // list: the ABI's counters, `reconciled` a boolean.
    let list = ok(&stack, "libkrun", "list", json!({})).await;
    assert_eq!(list["reconciled"], true, "{list}");
    let in_flight = list["in_flight"].as_u64().expect("in_flight");
    let cap = list["cap"].as_u64().expect("cap");
    assert_eq!(list["remaining"].as_u64(), Some(cap - in_flight));
    assert!(
        list["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .any(|s| s["sandbox_id"] == id.as_str()),
        "{list}"
    );

    // fs: every byte value, with a mode given as the ABI's number (and our `parents` beside
    // the ABI's fields). Outside /tmp, which a snapshot does not keep.
    let bytes: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let written = ok(
        &stack,
        "libkrun",
        "fs::write",
        json!({"sandbox_id": id, "path": "/opt/family/blob.bin", "bytes_base64": b64, "mode": 0o750, "parents": true}),
    )
    .await;
    assert!(written.is_object(), "{written}");
    assert_eq!(read_bytes(&stack, &id, "/opt/family/blob.bin").await, bytes);
    let mode = ok(
        &stack,
        "libkrun",
        "exec",
        json!({"sandbox_id": id, "cmd": "stat", "args": ["-c", "%a", "/opt/family/blob.bin"]}),
    )
    .await;
    assert_eq!(mode["stdout"], "750\n");

    // snapshot, and a create from its id.
    let snapshot = ok(&stack, "libkrun", "snapshot", json!({"sandbox_id": id})).await;
    let snapshot_id = snapshot["snapshot_id"]
        .as_str()
        .expect("snapshot_id")
        .to_string();
    let restored = ok(&stack, "libkrun", "create", json!({"image": snapshot_id})).await;
    let restored_id = restored["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();
    assert_eq!(restored["image"], snapshot_id.as_str());
    assert_eq!(
        read_bytes(&stack, &restored_id, "/opt/family/blob.bin").await,
        bytes
    );

    // branch: two by default, each with the source's files.
    let branched = ok(&stack, "libkrun", "branch", json!({"sandbox_id": id})).await;
    let branches: Vec<String> = branched["sandbox_ids"]
        .as_array()
        .expect("sandbox_ids")
        .iter()
        .map(|b| b.as_str().expect("an id").to_string())
        .collect();
    assert_eq!(branches.len(), 2, "{branched}");
    for branch in &branches {
        assert_eq!(
            read_bytes(&stack, branch, "/opt/family/blob.bin").await,
            bytes
        );
    }

    // expose_port: our port::expose under the ABI's name; the URL reaches a server inside.
    ok(
        &stack,
        "libkrun",
        "exec",
        json!({"sandbox_id": id, "cmd": "sh", "args": ["-c",
               "cd /opt/family && setsid python3 -m http.server 8000 >/dev/null 2>&1 &"]}),
    )
    .await;
    let exposed = ok(
        &stack,
        "libkrun",
        "expose_port",
        json!({"sandbox_id": id, "port": 8000}),
    )
    .await;
    let url = exposed["url"].as_str().expect("url").to_string();
    let listing = http_get(&url, "/").await;
    assert!(listing.contains("blob.bin"), "{url}: {listing}");

    // stop: twice, then ids nothing runs under; all `{}`.
    assert_eq!(
        ok(&stack, "libkrun", "stop", json!({"sandbox_id": id})).await,
        json!({})
    );
    assert_eq!(
        ok(&stack, "libkrun", "stop", json!({"sandbox_id": id})).await,
        json!({})
    );
    let unknown = "6f1c0b9e-3f52-4a8e-9d0b-2f4b1d7c9e11";
    assert_eq!(
        ok(&stack, "libkrun", "stop", json!({"sandbox_id": unknown})).await,
        json!({})
    );
    assert_eq!(
        ok(
            &stack,
            "libkrun",
            "stop",
            json!({"sandbox_id": "not-a-uuid"})
        )
        .await,
        json!({})
    );

    // Our error crosses the router with its S-code and body in the text.
    let gone = routed(
        &stack,
        "exec",
        json!({"provider": "libkrun", "sandbox_id": id, "cmd": "true"}),
    )
    .await
    .expect_err("exec in a stopped sandbox");
    assert!(
        gone.message.contains("[S502]") && gone.message.contains("(S004)"),
        "{gone:?}"
    );
    assert!(gone.message.contains("\"code\":\"S004\""), "{gone:?}");
    // The router's own refusal: no adapter under that name (`local`, its default, included).
    for payload in [json!({"provider": "nope"}), json!({})] {
        let unknown = routed(&stack, "list", payload.clone())
            .await
            .expect_err("unknown provider");
        assert!(unknown.message.contains("[S600]"), "{payload}: {unknown:?}");
    }

    for other in [restored_id, branches[0].clone(), branches[1].clone()] {
        ok(&stack, "libkrun", "stop", json!({"sandbox_id": other})).await;
    }
    // Our own functions answer under the family prefix too (here the router's
    // forwarding is not involved: it serves only the ABI's leaves).
    let deleted = stack
        .client
        .invoke(
            &format!("{prefix}snapshot::delete"),
            json!({"name": snapshot_id}),
            call_timeout(),
        )
        .await
        .expect("snapshot::delete under the family prefix");
    assert_eq!(deleted["deleted"], true, "{deleted}");
    router.shutdown_async().await;
}

/// An iii user's caller, with the official Python SDK (`family_caller.py`), through the
/// router: create, exec with `args`, `cwd` and `env`, binary bytes written with a mode and read
/// back, list, stop twice and of an unknown id, and our S-code in a refusal's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_reaches_it_through_the_router() {
    let test = "the_official_python_sdk_reaches_it_through_the_router";
    if !usable(test) {
        return;
    }
    // The VM lab has no network: its run brings the SDK installed on the host.
    let installed = std::env::var_os("SANDBOX_E2E_PYSDK_DIR").map(std::path::PathBuf::from);
    let sdk = match installed.map_or_else(e2e_tests::python_sdk, Ok) {
        Ok(dir) => dir,
        Err(why) => {
            println!("\n*** {test} DID NOT RUN: {why} ***\n");
            return;
        }
    };
    let stack = Stack::start(json!({}), options(None)).await;
    let router = family_support::start(&stack.engine.url(), "local");
    for leaf in family_support::LEAVES {
        wait_for(&stack, &format!("sandbox::{leaf}")).await;
    }
    let caller = e2e_tests::repo_root().join("tests/e2e/tests/family_caller.py");
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(&caller)
        .arg(stack.engine.url())
        .arg("libkrun")
        .env("PYTHONPATH", &sdk)
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "family_caller.py: {}\n{stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        stack.adapter.log()
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("family_caller.py printed no JSON ({e}): {stdout}"));
    assert_eq!(seen["create"]["image"], "python", "{seen}");
    assert!(seen["create"]["capabilities"].is_array(), "{seen}");
    assert_eq!(seen["exec"]["stdout"], "/tmp\nfrom python\n", "{seen}");
    assert_eq!(seen["exec"]["exit_code"], 0, "{seen}");
    assert_eq!(seen["exec"]["timed_out"], false, "{seen}");
    assert_eq!(seen["read_back_equal"], true, "{seen}");
    assert_eq!(seen["read_mode"], "0640", "{seen}");
    assert_eq!(seen["list"]["reconciled"], true, "{seen}");
    assert_eq!(seen["stops"], json!([{}, {}, {}]), "{seen}");
    let refusal = seen["exec_after_stop"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("exec after stop answered: {seen}"));
    assert!(
        refusal.contains("S502") && refusal.contains("S004"),
        "{refusal}"
    );
    router.shutdown_async().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_makes_the_adapter_the_routers_default_and_empty_turns_the_surface_off() {
    let stack = Stack::start(json!({}), options(Some("local"))).await;
    wait_for(&stack, "sandbox::provider::local::list").await;
    assert!(listed(&stack, "sandbox::provider::libkrun::")
        .await
        .is_empty());
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    assert_eq!(info["family"]["name"], "local", "{info}");
    assert_eq!(info["family"]["prefix"], "sandbox::provider::local");
    let router = family_support::start(&stack.engine.url(), "local");
    wait_for(&stack, "sandbox::list").await;
    let list = routed(&stack, "list", json!({}))
        .await
        .expect("list through the router's default provider");
    assert_eq!(list["reconciled"], true, "{list}");
    router.shutdown_async().await;
    drop(stack);

    let off = Stack::start(json!({}), options(Some(""))).await;
    assert!(listed(&off, "sandbox::").await.is_empty());
    let info = off.call("adapter::info", json!({})).await.expect("info");
    assert_eq!(info["family"], Value::Null, "{info}");
}

#[test]
fn a_malformed_family_name_is_refused_at_start_up() {
    for bad in ["Libkrun", "a::b", "-x", &"x".repeat(33)] {
        // Refused before any connection: no engine is needed.
        let mut adapter = Adapter::spawn("ws://127.0.0.1:9", &options(Some(bad)));
        let status = adapter
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{bad:?}: the adapter kept running"));
        assert_eq!(status.code(), Some(2), "{bad:?}: {}", adapter.log());
        assert!(
            adapter.log().contains(FAMILY_NAME_ENV),
            "{bad:?}: {}",
            adapter.log()
        );
    }
}
