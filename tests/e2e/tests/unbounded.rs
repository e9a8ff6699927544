//! An ordinary user's adapter either bounds its sandboxes or says it cannot (bwrap plugin).
//! Started without a delegated cgroup it can hold no cpus, memory or pids limit: a create is
//! S300 naming what is missing and how to delegate, unless `allow_unbounded_sandboxes: true`,
//! and then `adapter::info` and every create's log line say the sandbox is not bounded. With
//! a delegated cgroup (scripts/test.sh's ordinary-user pass, tests/e2e/delegate-cgroup.sh)
//! the limit tests of bounded.rs, limits.rs and shared_host.rs run as they do for root.

mod sandbox_support;

use e2e_tests::{adapter_user, bwrap_usable, strip_ansi, AdapterOptions, Stack};
use sandbox_support::{create, exec_ok, expect_err, stop};
use serde_json::{json, Value};

async fn limits(stack: &Stack) -> Value {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    info["backend"]["limits"].clone()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// The adapter as the ordinary user, started outside any delegated cgroup (the harness
/// moves it into `$SANDBOX_E2E_ADAPTER_CGROUPS` first; an empty list moves it nowhere).
fn undelegated() -> AdapterOptions {
    AdapterOptions {
        env: vec![("SANDBOX_E2E_ADAPTER_CGROUPS".into(), String::new())],
        ..AdapterOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ordinary_users_adapter_without_a_delegated_cgroup_refuses_creates_unless_allowed() {
    let test =
        "an_ordinary_users_adapter_without_a_delegated_cgroup_refuses_creates_unless_allowed";
    if !bwrap_usable(test) {
        return;
    }
    if adapter_user().is_none() {
        println!(
            "\n*** {test} DID NOT RUN: the adapter runs as the test's user here; scripts/test.sh's ordinary-user pass (SANDBOX_E2E_ADAPTER_USER) runs it ***\n"
        );
        return;
    }
    let stack = Stack::start(json!({}), undelegated()).await;
    let refused = limits(&stack).await;
    if refused["bounded"] == true {
        println!(
            "\n*** {test} DID NOT RUN: the adapter's own cgroup is delegated to its user even outside $SANDBOX_E2E_ADAPTER_CGROUPS (a systemd user session?): {refused} ***\n"
        );
        return;
    }
    assert_eq!(refused["bounded"], false, "{refused}");
    assert_eq!(refused["allow_unbounded_sandboxes"], false, "{refused}");
    assert!(
        text(&refused["creates"]).starts_with("refused (S300)"),
        "{refused}"
    );
    let missing = text(&refused["missing"]);
    for named in ["memory", "pids", "Delegate=yes", "delegate-cgroup.sh"] {
        assert!(missing.contains(named), "names {named:?}: {refused}");
    }
    let (code, body) = expect_err(
        stack.call("create", json!({"image": "python"})).await,
        "create without a delegated cgroup",
    );
    assert_eq!(code, "S300", "{body}");
    let message = text(&body["message"]);
    println!("create without a delegated cgroup: {message}");
    for named in [
        "cannot bound a sandbox's cpus, memory and pids",
        "Delegate=yes",
        "allow_unbounded_sandboxes: true",
    ] {
        assert!(message.contains(named), "names {named:?}: {body}");
    }
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(
        list["in_flight"], 0,
        "no slot kept by a refused create: {list}"
    );
    drop(stack);

    // Allowed: created, and said to be unbounded, up front and at each create.
    let stack = Stack::start(json!({"allow_unbounded_sandboxes": true}), undelegated()).await;
    let allowed = limits(&stack).await;
    assert_eq!(allowed["bounded"], false, "{allowed}");
    assert_eq!(allowed["allow_unbounded_sandboxes"], true, "{allowed}");
    assert!(
        text(&allowed["creates"]).contains("NOT bounded"),
        "{allowed}"
    );
    let id = create(&stack, "python", json!({})).await;
    let echo = exec_ok(&stack, &id, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(echo["stdout"], "ok\n", "{echo}");
    let log = strip_ansi(&stack.adapter.log());
    let line = log
        .lines()
        .find(|l| l.contains("sandbox created") && l.contains(&id))
        .unwrap_or_else(|| panic!("no create line for {id}:\n{log}"));
    assert!(line.contains("bounded=false"), "{line}");
    println!("allowed: {allowed}\n{line}");
    stop(&stack, &id, true).await;
}

/// Where the adapter can bound sandboxes (root; an ordinary user with a delegated cgroup),
/// `adapter::info` says so and by what, and the create's log line says it too.
#[tokio::test(flavor = "multi_thread")]
async fn a_bounding_adapter_says_so_up_front_and_at_each_create() {
    let test = "a_bounding_adapter_says_so_up_front_and_at_each_create";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::bwrap().await;
    let said = limits(&stack).await;
    if said["bounded"] != true {
        println!(
            "\n*** {test} DID NOT RUN: sandboxes are not bounded on this host (an ordinary user without a delegated cgroup): {said} ***\n"
        );
        return;
    }
    assert!(text(&said["by"]).contains("cgroup"), "{said}");
    let id = create(&stack, "python", json!({})).await;
    let log = strip_ansi(&stack.adapter.log());
    let line = log
        .lines()
        .find(|l| l.contains("sandbox created") && l.contains(&id))
        .unwrap_or_else(|| panic!("no create line for {id}:\n{log}"));
    assert!(line.contains("bounded=true"), "{line}");
    stop(&stack, &id, true).await;
}
