//! A sandbox whose agent never answers: create is S300, the message says what failed and
//! carries the tail of the sandbox's own log, nothing is left behind, and the adapter serves on.

use e2e_tests::{bwrap_usable, error_body, s_code, AdapterOptions, Stack};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_never_answers_is_s300_with_the_sandbox_log_tail() {
    if !bwrap_usable("an_agent_that_never_answers_is_s300_with_the_sandbox_log_tail") {
        return;
    }
    // A static program that is not our agent: busybox, asked for an applet it lacks.
    let busybox = std::path::Path::new("/bin/busybox");
    if !busybox.is_file() {
        println!("\n*** boot failure test DID NOT RUN: /bin/busybox missing (tests/fixtures/install.sh) ***\n");
        return;
    }
    let options = AdapterOptions {
        env: vec![("SANDBOX_AGENT_PATH".into(), busybox.display().to_string())],
        ..AdapterOptions::default()
    };
    let stack = Stack::start(json!({}), options).await;
    let message = create_refused_with_s300(&stack).await;
    assert!(
        message.contains("the sandbox agent did not start"),
        "{message}"
    );
    assert!(
        message.contains("sandbox log tail"),
        "the log tail is missing: {message}"
    );
    assert!(
        message.contains("applet not found"),
        "busybox's own complaint is missing: {message}"
    );

    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["in_flight"], 0, "{list}");
    let layers = std::fs::read_dir(stack.state_dir.path().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(layers, 0, "the failed sandbox's layer is removed");
}

/// Without its launcher the bwrap plugin says so up front (`adapter::info`) and on create
/// (S300 naming the launcher and how to point at it), and keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_launcher_is_reported_by_info_and_create() {
    if !bwrap_usable("a_missing_launcher_is_reported_by_info_and_create") {
        return;
    }
    let nowhere = e2e_tests::host_dir();
    let missing = nowhere.path().join("sandbox-bwrap-launch");
    let options = AdapterOptions {
        env: vec![("SANDBOX_BWRAP_LAUNCH".into(), missing.display().to_string())],
        ..AdapterOptions::default()
    };
    let stack = Stack::start(json!({}), options).await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    assert_eq!(info["backend"]["ready"], false, "{info}");
    let reason = info["backend"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("sandbox-bwrap-launch") && reason.contains("SANDBOX_BWRAP_LAUNCH"),
        "{info}"
    );
    let message = create_refused_with_s300(&stack).await;
    assert!(message.contains("sandbox-bwrap-launch"), "{message}");
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["in_flight"], 0, "{list}");
}

/// A python create that must fail with S300; its message.
async fn create_refused_with_s300(stack: &Stack) -> String {
    let error = stack
        .call("create", json!({"image": "python"}))
        .await
        .unwrap_err();
    assert_eq!(s_code(&error), "S300", "{error:?}");
    error_body(&error)["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
