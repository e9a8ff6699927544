//! The foundation end to end: the real `sandbox-libkrun` binary on its plugins,
//! through the test engine. `adapter::info`, the registered schemas, the worker name, the
//! worker-token guard and what the log may hold, the bwrap plugin under its own name, and
//! plugin files that are not plugins.

mod foundation_support;

use std::path::Path;
use std::time::Duration;

use e2e_tests::{
    bwrap_usable, error_body, plugin_path, s_code, AdapterOptions, PluginKind, CALL_TIMEOUT,
};
use foundation_support::{
    assert_refused, eventually, mapped_libc, run_with_plugin, workers_named, Bare,
};
use iii_test_engine::Engine;
use plugin_api::host::PluginLibrary;
use serde_json::{json, Value};

/// The libkrun plugin by its default name: no `--prefix`.
fn libkrun_options(worker_name: &str, env: &[(&str, &str)]) -> AdapterOptions {
    AdapterOptions {
        plugin: PluginKind::Libkrun,
        prefix: None,
        worker_name: worker_name.into(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..AdapterOptions::default()
    }
}

/// Whether this host has what libkrun needs from KVM: a usable `/dev/kvm` backed by a
/// hardware module. Read from the same files an operator would look at.
fn host_has_hardware_kvm() -> bool {
    let usable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let hardware = ["kvm_intel", "kvm_amd"]
        .iter()
        .any(|m| Path::new("/sys/module").join(m).exists());
    usable && hardware
}

#[tokio::test(flavor = "multi_thread")]
async fn libkrun_plugin_answers_info_registers_its_schemas_and_its_worker_name() {
    let worker_name = "e2e-foundation-worker";
    let bare = Bare::start(json!({}), libkrun_options(worker_name, &[])).await;
    let manifest = PluginLibrary::load(&plugin_path(PluginKind::Libkrun))
        .expect("load the libkrun plugin in the test")
        .manifest()
        .clone();

    // adapter::info
    let info = bare
        .call("adapter::info", json!({}))
        .await
        .unwrap_or_else(|e| panic!("adapter::info: {e:?}\n{}", bare.adapter.log()));
    assert_eq!(info["adapter"], "sandbox-libkrun", "{info}");
    assert_eq!(info["adapter_version"], manifest.adapter_version, "{info}");
    assert_eq!(info["contract"], json!({"major": 1, "minor": 1}), "{info}");
    // The adapter names the target it was built for; it runs here, so it is this host's.
    let target = info["target"].as_str().expect("target is a string");
    assert!(
        target.starts_with(std::env::consts::ARCH) && target.contains("-linux-"),
        "{info}"
    );
    let features = info["features"].as_array().expect("features is an array");
    assert!(!features.is_empty(), "{info}");
    assert!(features.iter().all(Value::is_string), "{info}");
    let ready = info["backend"]["ready"].as_bool().expect("backend.ready");
    let reason = info["backend"]["reason"].as_str().unwrap_or_default();
    if host_has_hardware_kvm() {
        println!("host has hardware KVM: backend.ready = {ready}, reason = {reason:?}");
        assert!(
            ready || !reason.is_empty(),
            "not ready needs a reason: {info}"
        );
    } else {
        assert!(!ready, "this host has no hardware KVM: {info}");
        assert!(
            reason.contains("KVM") || reason.contains("PVM") || reason.contains("/dev/kvm"),
            "the reason must say what KVM lacks: {info}"
        );
        if Path::new("/sys/module/kvm_pvm").exists() {
            assert!(reason.contains("PVM"), "PVM host: {info}");
        }
    }

    // Every manifest function is registered under the plugin's name, with its schemas, as
    // soon as adapter::info answers (the shell registers it last).
    for spec in &manifest.functions {
        let id = format!("sandbox-libkrun::{}", spec.id);
        let registered = bare
            .client
            .invoke(
                "engine::functions::info",
                json!({"function_id": id}),
                CALL_TIMEOUT,
            )
            .await
            .unwrap_or_else(|e| panic!("{id} is not registered: {e:?}"));
        assert_eq!(registered["description"], spec.description, "{id}");
        assert_eq!(registered["worker_name"], worker_name, "{id}");
        if ["create", "exec", "run"].contains(&spec.id.as_str()) {
            assert_eq!(registered["request_format"], spec.request_schema, "{id}");
            assert_eq!(registered["response_format"], spec.response_schema, "{id}");
        }
    }
    let create = bare
        .client
        .invoke(
            "engine::functions::info",
            json!({"function_id": "sandbox-libkrun::create"}),
            CALL_TIMEOUT,
        )
        .await
        .expect("create info");
    assert_eq!(create["request_format"]["required"], json!(["image"]));

    // The worker shows under $III_WORKER_NAME, owning exactly the manifest's functions: its
    // own, and its family functions under the default provider name (docs/family.md).
    let workers = eventually(Duration::from_secs(30), || async {
        let found = workers_named(&bare.client, worker_name).await;
        (!found.is_empty()).then_some(found)
    })
    .await
    .unwrap_or_else(|| panic!("no worker named {worker_name}\n{}", bare.adapter.log()));
    assert_eq!(workers.len(), 1, "{workers:?}");
    let mut owned: Vec<String> = workers[0]["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect();
    owned.sort();
    let mut declared: Vec<String> = manifest
        .functions
        .iter()
        .map(|f| format!("sandbox-libkrun::{}", f.id))
        .chain(
            manifest
                .family
                .iter()
                .map(|f| format!("sandbox::provider::libkrun::{}", f.id)),
        )
        .collect();
    declared.sort();
    assert_eq!(owned, declared);
    assert_eq!(workers[0]["pid"], bare.adapter.pid(), "{workers:?}");
    assert!(
        workers_named(&bare.client, "sandbox-libkrun")
            .await
            .is_empty(),
        "the default name must not be used when III_WORKER_NAME is set"
    );
}

/// Every `worker::*` operation of SPEC.md section 6.
const WORKER_OPERATIONS: [&str; 6] = ["prepare", "start", "status", "logs", "stop", "destroy"];

/// A value that appears nowhere unless this test put it there.
fn marker(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{what}-{}-{nanos}", std::process::id())
}

/// The calls every guard adapter gets: guarded ones carrying the token and a guest
/// environment, and an unguarded one carrying a payload marker.
async fn guarded_calls(bare: &Bare, token: &str, guest_env: &str, payload: &str) {
    for (auth, case) in [
        (None, "no auth"),
        (Some(json!("not-the-token")), "wrong token"),
        (Some(json!(format!("{token}x"))), "token plus one byte"),
        (
            Some(json!(&token[..token.len() - 1])),
            "token minus one byte",
        ),
        (Some(json!(7)), "auth not a string"),
    ] {
        for op in WORKER_OPERATIONS {
            let mut request = json!({"vm_id": "vm1"});
            if let Some(auth) = &auth {
                request["auth"] = auth.clone();
            }
            let error = bare
                .call(&format!("worker::{op}"), request)
                .await
                .expect_err(case);
            assert_eq!(s_code(&error), "S505", "{op}, {case}: {error:?}");
            assert_eq!(error_body(&error)["type"], "unauthorized", "{op}, {case}");
            assert!(!error.message.contains(token), "{op}, {case}: token echoed");
        }
    }
    for op in WORKER_OPERATIONS {
        let request = json!({
            "auth": token, "vm_id": "vm1",
            "env": {"GUEST_SECRET": guest_env}, "marker": payload,
        });
        match bare.call(&format!("worker::{op}"), request).await {
            Ok(answer) => assert!(!answer.to_string().contains(token), "{op}: {answer}"),
            Err(error) => {
                assert_ne!(s_code(&error), "S505", "{op}: the right token: {error:?}");
                assert!(!error.message.contains(token), "{op}: token echoed");
            }
        }
    }
    bare.call("adapter::info", json!({"marker": payload}))
        .await
        .expect("adapter::info with an extra field");
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_token_guards_worker_functions_and_never_reaches_the_log() {
    let token = marker("tok");
    let guest_env = marker("guest-env");
    let payload = marker("payload");
    let silent_env = [
        ("III_SANDBOX_WORKER_TOKEN", token.as_str()),
        ("III_DISABLE_TRACE_PAYLOADS", "1"),
        ("RUST_LOG", "debug"),
    ];
    let loud_env = [
        ("III_SANDBOX_WORKER_TOKEN", token.as_str()),
        ("RUST_LOG", "debug"),
    ];
    let (silent, loud, tokenless) = tokio::join!(
        Bare::start(json!({}), libkrun_options("guard-silent", &silent_env)),
        Bare::start(json!({}), libkrun_options("guard-loud", &loud_env)),
        Bare::start(
            json!({}),
            libkrun_options("guard-none", &[("RUST_LOG", "debug")])
        ),
    );

    guarded_calls(&silent, &token, &guest_env, &payload).await;
    guarded_calls(&loud, &token, &guest_env, &payload).await;
    for auth in [json!(token), json!(""), json!("anything")] {
        let error = tokenless
            .call("worker::start", json!({"auth": auth, "vm_id": "vm1"}))
            .await
            .expect_err("no token configured");
        assert_eq!(s_code(&error), "S505", "{error:?}");
        assert!(
            error_body(&error)["message"]
                .as_str()
                .is_some_and(|m| m.contains("III_SANDBOX_WORKER_TOKEN")),
            "says why: {error:?}"
        );
    }

    let silent_log = silent.adapter.log();
    assert!(
        silent_log.contains("DEBUG"),
        "debug level is on:\n{silent_log}"
    );
    for (secret, what) in [
        (&token, "token"),
        (&guest_env, "guest environment"),
        (&payload, "payload"),
    ] {
        assert!(
            !silent_log.contains(secret.as_str()),
            "{what} in the log with III_DISABLE_TRACE_PAYLOADS=1:\n{silent_log}"
        );
    }
    // Without the switch, payloads are logged at debug level (so the switch does something),
    // but the token still is not.
    let loud_log = loud.adapter.log();
    assert!(
        loud_log.contains(&payload),
        "payloads are logged at debug level without III_DISABLE_TRACE_PAYLOADS:\n{loud_log}"
    );
    assert!(!loud_log.contains(&token), "token in the log:\n{loud_log}");
    assert!(!tokenless.adapter.log().contains(&token));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_binary_serves_the_bwrap_plugin_under_its_own_name() {
    let options = AdapterOptions {
        plugin: PluginKind::Bwrap,
        prefix: None,
        ..AdapterOptions::default()
    };
    let bare = Bare::start(json!({}), options).await;
    assert_eq!(bare.prefix, "sandbox-bwrap");
    let info = bare
        .call("adapter::info", json!({}))
        .await
        .unwrap_or_else(|e| panic!("sandbox-bwrap::adapter::info: {e:?}"));
    assert_eq!(info["adapter"], "sandbox-bwrap", "{info}");
    assert_eq!(info["contract"], json!({"major": 1, "minor": 1}), "{info}");
    assert_eq!(info["backend"]["name"], "bwrap", "{info}");
    let absent = bare
        .client
        .invoke(
            "sandbox-libkrun::adapter::info",
            json!({}),
            Duration::from_secs(10),
        )
        .await
        .expect_err("nothing serves sandbox-libkrun here");
    assert_eq!(
        absent.code,
        iii_test_engine::FUNCTION_NOT_FOUND,
        "{absent:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_that_is_not_a_plugin_exits_2_with_one_line() {
    let engine = Engine::start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine");
    let dir = e2e_tests::host_dir();
    let text = dir.path().join("notes.so");
    std::fs::write(&text, "this is a text file, not a library\n").unwrap();
    let empty = dir.path().join("empty.so");
    std::fs::write(&empty, b"").unwrap();
    let truncated = dir.path().join("truncated.so");
    let real = std::fs::read(plugin_path(PluginKind::Libkrun)).unwrap();
    std::fs::write(&truncated, &real[..real.len().min(4096)]).unwrap();
    let half = dir.path().join("half.so");
    std::fs::write(&half, &real[..real.len() / 2]).unwrap();
    let missing = dir.path().join("missing.so");

    let mut cases = vec![
        (text, "not an ELF shared library"),
        (empty, "not an ELF shared library"),
        (truncated, "truncated"),
        (half, "truncated"),
        (missing, "No such file"),
        (dir.path().to_path_buf(), "not a regular file"),
    ];
    match mapped_libc() {
        Some(libc) => cases.push((libc, "exports no plugin root module")),
        None => println!("*** no libc found in /proc/self/maps: the libc case DID NOT RUN ***"),
    }
    let url = engine.url();
    let runs: Vec<_> = cases
        .into_iter()
        .map(|(path, expected)| {
            let url = url.clone();
            tokio::task::spawn_blocking(move || {
                let (status, log) = run_with_plugin(&url, &path);
                (path, expected, status, log)
            })
        })
        .collect();
    for run in runs {
        let (path, expected, status, log) = run.await.expect("case ran");
        let case = path.display().to_string();
        let status = status.unwrap_or_else(|| panic!("{case}: still running\n{log}"));
        let parts = [expected, "not a sandbox plugin library", case.as_str()];
        assert_refused(status, &log, 2, &parts, &case);
    }
    // None of them reached the engine: loading comes before connecting.
    let client = e2e_tests::Client::connect(&url).await.expect("client");
    let list = client
        .invoke("engine::workers::list", json!({}), CALL_TIMEOUT)
        .await
        .expect("workers");
    assert_eq!(list["workers"].as_array().map(Vec::len), Some(1), "{list}");
}

/// A plugin built against another version of plugin-api (tests/e2e/other-interface-plugin,
/// built here with cargo) is refused by abi_stable's load-time check: exit 2, one line.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_built_against_another_interface_version_exits_2() {
    let crate_dir = e2e_tests::repo_root().join("tests/e2e/other-interface-plugin");
    let target_dir = e2e_tests::profile_dir().join("../other-interface");
    let built = tokio::task::spawn_blocking(move || {
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--quiet", "--manifest-path"])
            .arg(crate_dir.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .status()
            .map(|status| {
                (
                    status,
                    target_dir.join("debug/libother_interface_plugin.so"),
                )
            })
    })
    .await
    .expect("build task");
    let (status, plugin) = built.expect("run cargo");
    assert!(
        status.success(),
        "building the other-interface plugin failed"
    );

    let engine = Engine::start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine");
    let url = engine.url();
    let (status, log) = tokio::task::spawn_blocking(move || run_with_plugin(&url, &plugin))
        .await
        .expect("adapter ran");
    let status = status.unwrap_or_else(|| panic!("still running\n{log}"));
    let parts = [
        "built against another plugin interface version",
        "library:1.0.0",
    ];
    assert_refused(status, &log, 2, &parts, "other interface version");
}

/// `III_DISABLE_TRACE_PAYLOADS` with real sandboxes: a guest environment given to `create`,
/// `exec` and `run`, and the output that echoes it, stay out of a debug-level log; without
/// the switch the same calls do show up there.
#[tokio::test(flavor = "multi_thread")]
async fn guest_environment_stays_out_of_the_log_when_payloads_are_disabled() {
    if !bwrap_usable("guest_environment_stays_out_of_the_log_when_payloads_are_disabled") {
        return;
    }
    for disabled in [true, false] {
        let guest = marker(if disabled {
            "guest-silent"
        } else {
            "guest-loud"
        });
        let mut env = vec![("RUST_LOG".to_string(), "debug".to_string())];
        if disabled {
            env.push(("III_DISABLE_TRACE_PAYLOADS".into(), "true".into()));
        }
        let options = AdapterOptions {
            env,
            ..AdapterOptions::default()
        };
        let stack = e2e_tests::Stack::start(json!({}), options).await;
        let created = stack
            .call(
                "create",
                json!({"image": "python", "env": {"GUEST_A": guest}}),
            )
            .await
            .unwrap_or_else(|e| panic!("create: {e:?}\n{}", stack.adapter.log()));
        let id = created["sandbox_id"].as_str().expect("sandbox_id");
        let echoed = stack
            .call(
                "exec",
                json!({"sandbox_id": id, "argv": ["/bin/sh", "-c", "echo $GUEST_A $GUEST_B"],
                       "env": [format!("GUEST_B={guest}")]}),
            )
            .await
            .expect("exec");
        assert_eq!(echoed["stdout"], format!("{guest} {guest}\n"), "{echoed}");
        let ran = stack
            .call(
                "run",
                json!({"image": "python", "lang": "python",
                       "code": "import os; print(os.environ['GUEST_C'])", "env": {"GUEST_C": guest}}),
            )
            .await
            .expect("run");
        assert_eq!(ran["stdout"], format!("{guest}\n"), "{ran}");
        stack
            .call("stop", json!({"sandbox_id": id, "wait": true}))
            .await
            .expect("stop");
        let log = stack.adapter.log();
        assert!(log.contains("DEBUG"), "debug level is on:\n{log}");
        if disabled {
            assert!(
                !log.contains(&guest),
                "guest environment in the log:\n{log}"
            );
        } else {
            assert!(
                log.contains(&guest),
                "payloads logged without the switch:\n{log}"
            );
        }
    }
}
