//! Configuration end to end (SPEC.md section 3): every rule that stops the adapter at start
//! (exit 2 and a one-line reason on stderr), and a valid configuration's values in force,
//! observed through the bus.

mod foundation_support;

use std::time::Duration;

use e2e_tests::{bwrap_usable, error_body, s_code, Adapter, AdapterOptions, PluginKind, Stack};
use foundation_support::{assert_refused, eventually, exit_of, Bare};
use iii_test_engine::Engine;
use serde_json::{json, Value};

/// One configuration that must stop the adapter: the entry's value (`None`: no entry at all),
/// the id to read it under, and what the reason must say.
struct Case {
    name: &'static str,
    config_id: &'static str,
    value: Option<Value>,
    expected: &'static [&'static str],
}

fn case(name: &'static str, value: Value, expected: &'static [&'static str]) -> Case {
    Case {
        name,
        config_id: name,
        value: Some(value),
        expected,
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "missing-entry",
            config_id: "missing-entry",
            value: None,
            expected: &[
                "`missing-entry` does not exist",
                "configuration::register",
                "configuration::set",
            ],
        },
        Case {
            name: "unreadable-id",
            config_id: "Not A Valid Id!",
            value: None,
            expected: &["cannot read configuration entry", "INVALID_ID"],
        },
        case("array", json!([]), &["must be a JSON object, got an array"]),
        case(
            "string",
            json!("python"),
            &["must be a JSON object, got a string"],
        ),
        case("null", Value::Null, &["must be a JSON object, got null"]),
        case(
            "wrapped",
            json!({"sandbox": {"auto_install": true, "max_concurrent_sandboxes": 4}}),
            &["old wrapped shape", "top level"],
        ),
        case(
            "bool-as-string",
            json!({"auto_install": "yes"}),
            &["key `auto_install`"],
        ),
        case(
            "list-as-string",
            json!({"image_allowlist": "python"}),
            &["key `image_allowlist`"],
        ),
        case(
            "negative-count",
            json!({"max_concurrent_sandboxes": -1}),
            &["key `max_concurrent_sandboxes`"],
        ),
        case(
            "count-as-string",
            json!({"max_concurrent_exec_per_sandbox": "4"}),
            &["key `max_concurrent_exec_per_sandbox`"],
        ),
        case(
            "fractional-ms",
            json!({"max_exec_timeout_ms": 1.5}),
            &["key `max_exec_timeout_ms`"],
        ),
        case(
            "cpus-as-bool",
            json!({"default_cpus": true}),
            &["key `default_cpus`"],
        ),
        case(
            "zero-cpus",
            json!({"default_cpus": 0}),
            &["key `default_cpus`", "at least 1"],
        ),
        case(
            "zero-image-size",
            json!({"max_image_size_mb": 0}),
            &["key `max_image_size_mb`", "at least 1"],
        ),
        case(
            "negative-image-size",
            json!({"max_image_size_mb": -5}),
            &["key `max_image_size_mb`"],
        ),
        case(
            "memory-as-object",
            json!({"default_memory_mb": {}}),
            &["key `default_memory_mb`"],
        ),
        case(
            "idle-as-string",
            json!({"default_idle_timeout_secs": "300"}),
            &["key `default_idle_timeout_secs`"],
        ),
        case(
            "caps-unknown-field",
            json!({"per_image_caps": {"python": {"max_cpu": 2}}}),
            &["key `per_image_caps`", "max_cpu"],
        ),
        case(
            "custom-as-list",
            json!({"custom_images": ["example.org/mine:1"]}),
            &["key `custom_images`"],
        ),
        case(
            "mirrors-as-list",
            json!({"registry_mirrors": ["127.0.0.1:5000"]}),
            &["key `registry_mirrors`"],
        ),
        case(
            "typo-sandboxes",
            json!({"max_concurent_sandboxes": 3}),
            &[
                "unknown configuration key `max_concurent_sandboxes`",
                "did you mean `max_concurrent_sandboxes`",
            ],
        ),
        case(
            "typo-allowlist",
            json!({"image_allow_list": ["python"]}),
            &["`image_allow_list`", "did you mean `image_allowlist`"],
        ),
        case(
            "typo-install",
            json!({"autoinstall": false}),
            &["`autoinstall`", "did you mean `auto_install`"],
        ),
        case(
            "custom-python",
            json!({"custom_images": {"python": "example.org/python:3"}, "image_allowlist": ["python"]}),
            &["`custom_images.python` reuses the name of a preset"],
        ),
        case(
            "custom-node",
            json!({"custom_images": {"mine": "example.org/mine:1", "node": "example.org/node:1"}}),
            &["`custom_images.node` reuses the name of a preset"],
        ),
        case(
            "bus-access-string",
            json!({"sandbox_bus_access": "yes"}),
            &["key `sandbox_bus_access`"],
        ),
        case(
            "bus-call-empty-pattern",
            json!({"sandbox_bus_call": ["math::*", ""]}),
            &["key `sandbox_bus_call`", "entry 1"],
        ),
        case(
            "bus-register-not-a-list",
            json!({"sandbox_bus_register": "*"}),
            &["key `sandbox_bus_register`"],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_configuration_rule_stops_the_adapter_with_exit_2_and_the_reason() {
    let cases = cases();
    // One engine holds every entry; each adapter reads its own.
    let mut builder = Engine::builder();
    for case in &cases {
        if let Some(value) = &case.value {
            builder = builder.with_config(case.config_id, value.clone());
        }
    }
    let engine = builder
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine");
    // Both plugins validate through sandbox-core; the shell prints what they say. Half the
    // cases on each keeps the run short and covers both.
    let mut adapters: Vec<(Case, Adapter)> = cases
        .into_iter()
        .enumerate()
        .map(|(index, case)| {
            let plugin = if index % 2 == 0 {
                PluginKind::Libkrun
            } else {
                PluginKind::Bwrap
            };
            let options = AdapterOptions {
                plugin,
                prefix: Some(format!("config-case-{index}")),
                worker_name: format!("config-case-{index}"),
                config_name: case.config_id.to_string(),
                ..AdapterOptions::default()
            };
            let adapter = Adapter::spawn(&engine.url(), &options);
            (case, adapter)
        })
        .collect();
    for (case, adapter) in &mut adapters {
        let status = exit_of(adapter);
        let log = adapter.log();
        let id_part = format!("`{}`", case.config_id);
        let mut expected = case.expected.to_vec();
        expected.push(&id_part);
        assert_refused(status, &log, 2, &expected, case.name);
    }
}

/// `list` of the adapter at `bare`.
async fn list(bare: &Bare) -> Value {
    bare.call("list", json!({})).await.expect("list")
}

#[tokio::test(flavor = "multi_thread")]
async fn configured_caps_allowlist_and_auto_install_are_in_force() {
    if !bwrap_usable("configured_caps_allowlist_and_auto_install_are_in_force") {
        return;
    }
    // The image cache is this test's own empty directory (local_config), so nothing is
    // installed, and nothing may be pulled.
    let bare = Bare::start(
        json!({
            "max_concurrent_sandboxes": 3,
            "image_allowlist": ["node", "mine"],
            "auto_install": false,
            "per_image_caps": {"node": {"max_cpus": 1, "max_memory_mb": 1024}},
            "custom_images": {"mine": "127.0.0.1:9/mine:1", "other": "127.0.0.1:9/other:1"},
        }),
        AdapterOptions::default(),
    )
    .await;

    let listed = list(&bare).await;
    assert_eq!(listed["cap"], 3, "{listed}");
    assert_eq!(listed["remaining"], 3, "{listed}");
    assert_eq!(listed["in_flight"], 0, "{listed}");

    for (payload, code, case) in [
        (
            json!({"image": "python"}),
            "S100",
            "preset not in the allowlist",
        ),
        (
            json!({"image": "other"}),
            "S100",
            "custom not in the allowlist",
        ),
        (
            json!({"image": "node"}),
            "S101",
            "allowed, not installed, no auto_install",
        ),
        (
            json!({"image": "mine"}),
            "S101",
            "allowed custom, not installed",
        ),
        (
            json!({"image": "node", "cpus": 2}),
            "S400",
            "above per_image_caps cpus",
        ),
        (
            json!({"image": "node", "memory_mb": 2048}),
            "S400",
            "above per_image_caps memory",
        ),
    ] {
        let error = bare.call("create", payload.clone()).await.expect_err(case);
        assert_eq!(s_code(&error), code, "{case}: {payload}: {error:?}");
        let body = error_body(&error);
        assert_eq!(body["code"], code, "{case}: {body}");
    }
    // A refused create gives its slot back.
    assert_eq!(list(&bare).await["remaining"], 3);

    let catalog = bare
        .call("catalog::list", json!({}))
        .await
        .expect("catalog");
    let entry = |name: &str| {
        catalog["images"]
            .as_array()
            .and_then(|images| images.iter().find(|i| i["name"] == name).cloned())
            .unwrap_or_else(|| panic!("{name} not in {catalog}"))
    };
    for (name, kind, allowed) in [
        ("python", "preset", false),
        ("node", "preset", true),
        ("mine", "custom", true),
        ("other", "custom", false),
    ] {
        let image = entry(name);
        assert_eq!(image["kind"], kind, "{image}");
        assert_eq!(image["allowed"], allowed, "{image}");
        assert_eq!(image["installed"], false, "{image}");
    }
    assert_eq!(entry("mine")["oci_ref"], "127.0.0.1:9/mine:1");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_allowlist_denies_every_create() {
    if !bwrap_usable("an_empty_allowlist_denies_every_create") {
        return;
    }
    let bare = Bare::start(
        json!({"image_allowlist": [], "custom_images": {"mine": "127.0.0.1:9/mine:1"}}),
        AdapterOptions::default(),
    )
    .await;
    for image in ["python", "node", "mine"] {
        let error = bare
            .call("create", json!({"image": image}))
            .await
            .expect_err(image);
        assert_eq!(s_code(&error), "S100", "{image}: {error:?}");
        let error = bare
            .call(
                "run",
                json!({"image": image, "code": "print(1)", "lang": "python"}),
            )
            .await
            .expect_err(image);
        assert_eq!(s_code(&error), "S100", "run {image}: {error:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_cap_zero_means_one_and_the_timeout_ceiling_applies() {
    if !bwrap_usable("exec_cap_zero_means_one_and_the_timeout_ceiling_applies") {
        return;
    }
    let stack = Stack::start(
        json!({"max_concurrent_exec_per_sandbox": 0, "max_exec_timeout_ms": 3000}),
        AdapterOptions::default(),
    )
    .await;
    let created = stack
        .call("create", json!({"image": "python"}))
        .await
        .unwrap_or_else(|e| panic!("create: {e:?}\n{}", stack.adapter.log()));
    let id = created["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();

    let first = stack.call(
        "exec",
        json!({"sandbox_id": id, "argv": ["/bin/sh", "-c", "sleep 2; echo first"]}),
    );
    let while_busy = async {
        let busy = eventually(Duration::from_secs(20), || async {
            let listed = stack.call("list", json!({})).await.ok()?;
            let sandbox = listed["sandboxes"].as_array()?.first()?.clone();
            (sandbox["exec_in_flight"] == 1).then_some(sandbox)
        })
        .await
        .expect("the first exec shows in list");
        let second = stack
            .call("exec", json!({"sandbox_id": id, "argv": ["/bin/true"]}))
            .await
            .expect_err("a second exec while the only slot is taken");
        (busy, second)
    };
    let (first, (busy, second)) = tokio::join!(first, while_busy);
    assert_eq!(busy["exec_slots_free"], 0, "0 means 1 slot: {busy}");
    assert_eq!(s_code(&second), "S003", "{second:?}");
    let first = first.expect("first exec");
    assert_eq!(first["stdout"], "first\n", "{first}");

    // A slot is free again; the configured ceiling clamps a longer timeout_ms.
    let clamped = stack
        .call(
            "exec",
            json!({"sandbox_id": id, "argv": ["/bin/sh", "-c", "sleep 30"], "timeout_ms": 60000}),
        )
        .await
        .expect_err("clamped to max_exec_timeout_ms");
    assert_eq!(s_code(&clamped), "S200", "{clamped:?}");
}

/// `max_image_size_mb` is in force: with a fresh cache and a 1 MiB limit the python image
/// (tens of MiB) is refused before any download, S102 with `retryable: false`, and nothing is
/// installed.
#[tokio::test(flavor = "multi_thread")]
async fn the_image_size_limit_is_in_force() {
    if !bwrap_usable("the_image_size_limit_is_in_force") {
        return;
    }
    let cache = e2e_tests::host_dir();
    let stack = Stack::start(
        json!({"max_image_size_mb": 1, "image_cache_dir": cache.path()}),
        AdapterOptions::default(),
    )
    .await;
    let error = stack
        .call("create", json!({"image": "python"}))
        .await
        .expect_err("over the limit");
    assert_eq!(s_code(&error), "S102", "{error:?}");
    let body = error_body(&error);
    assert_eq!(body["retryable"], false, "{body}");
    assert_eq!(body["type"], "image_too_large", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_image_size_mb"), "{message}");
    let catalog = stack
        .call("catalog::list", json!({}))
        .await
        .expect("catalog");
    let python = catalog["images"]
        .as_array()
        .and_then(|images| images.iter().find(|i| i["name"] == "python"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(python["installed"], false, "{catalog}");
}
