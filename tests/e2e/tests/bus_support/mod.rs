//! What the bus tests share (bus_guard.rs, bus_guard_attacks.rs): the guest image with the
//! official Python SDK, whether a test can run here, and which backend is under test.

use std::sync::OnceLock;

use e2e_tests::{bwrap_usable, Stack};
use serde_json::json;

/// The pysdk fixture in the test registry (built and pushed once per test process), or why
/// not.
pub fn pysdk_image() -> Result<String, String> {
    static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let registry = e2e_tests::registry();
            let out = std::process::Command::new("bash")
                .arg(e2e_tests::repo_root().join("tests/fixtures/build-fixtures.sh"))
                .args([registry, "pysdk"])
                .output()
                .map_err(|e| format!("cannot run build-fixtures.sh: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "the pysdk fixture could not be built: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(format!("{registry}/fixtures/python-iii:latest"))
        })
        .clone()
}

/// Whether the test can run here (bwrap, pasta, the pysdk image); says why not.
pub fn usable(test: &str) -> bool {
    if !bwrap_usable(test) {
        return false;
    }
    if std::process::Command::new("pasta")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("\n*** {test} DID NOT RUN: needs pasta for sandboxes with network ***\n");
        return false;
    }
    if let Err(why) = pysdk_image() {
        // The lab's libkrun run is there to run these: a missing image fails it.
        assert!(!libkrun_under_test(), "{test} on libkrun: {why}");
        println!("\n*** {test} DID NOT RUN: {why} ***\n");
        return false;
    }
    true
}

/// The libkrun plugin's microVMs instead of bwrap, where `SANDBOX_E2E_NETWORK_PLUGIN=libkrun`
/// (the VM lab runs these tests so: a microVM's guest reaches the guard through pasta's port
/// of the runner's own network namespace, a bwrap sandbox's through its gate's forward).
pub fn libkrun_under_test() -> bool {
    std::env::var("SANDBOX_E2E_NETWORK_PLUGIN").is_ok_and(|p| p == "libkrun")
}

/// A sandbox with network and the engine's URL at its localhost, as iii's code runner creates
/// it, on the `pysdk` image, with `program` written at `path`.
pub async fn guest_sandbox(stack: &Stack, path: &str, program: &str) -> String {
    let url = format!("ws://localhost:{}", stack.engine.addr().port());
    let id = crate::sandbox_support::create(
        stack,
        "pysdk",
        json!({"network": true, "env": {"III_URL": url}}),
    )
    .await;
    stack
        .call(
            "fs::write",
            json!({"sandbox_id": id, "path": path, "content": program, "parents": true}),
        )
        .await
        .unwrap_or_else(|e| panic!("fs::write: {e:?}"));
    id
}
