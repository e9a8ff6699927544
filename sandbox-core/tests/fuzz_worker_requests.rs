//! `worker::*` through `SandboxPlugin::invoke` without a bootable host: random payloads never
//! panic and earn only the codes they can, and a worker recorded as running is started again
//! at start-up (here it fails, and says why, since no host root is configured).

mod support;

use std::path::Path;
use std::sync::Arc;

use plugin_api::Plugin;
use sandbox_core::SandboxPlugin;
use serde_json::{json, Value};
use support::{only_earnable_codes, NoBoot, Rng, Vocabulary};

const FIELDS: &[&str] = &[
    "vm_id",
    "image",
    "host_path",
    "cpus",
    "memory_mb",
    "command",
    "env",
    "workdir",
    "max_bytes",
    "timeout_ms",
    "_caller_worker_id",
];

const STRINGS: &[&str] = &[
    "",
    "w1",
    "ghost",
    "W1",
    "..",
    "a/b",
    "python",
    "nope-image",
    "/tmp",
    "relative",
    "/bin/sh",
    "K=V",
    "\0",
    "\u{1F600}",
];

const VOCABULARY: Vocabulary = Vocabulary {
    fields: FIELDS,
    strings: STRINGS,
    floats: false,
    longest: 300,
    items: 4,
    members: 5,
};

fn template(rng: &mut Rng, op: &str) -> Value {
    let vm_id = *rng.pick(&["w1", "ghost"]);
    let payload = match op {
        "prepare" => json!({"vm_id": vm_id, "image": "python", "host_path": "/tmp"}),
        "start" => json!({"vm_id": vm_id, "command": ["/bin/sh", "-c", "true"], "env": {"A": "1"}}),
        "logs" => json!({"vm_id": vm_id, "max_bytes": 10}),
        "stop" => json!({"vm_id": vm_id, "timeout_ms": 1}),
        _ => json!({ "vm_id": vm_id }),
    };
    VOCABULARY.mutate(rng, payload, 3)
}

/// A worker left by an earlier run: its directories and `worker.json`, as the adapter keeps
/// them under `<state_dir>/workers/<vm_id>/` (README, "Worker VMs").
fn write_record(state_dir: &Path, vm_id: &str, state: &str) {
    let dir = state_dir.join("workers").join(vm_id);
    for sub in ["layer", "data", "logs"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let record = json!({
        "vm_id": vm_id, "image": "python", "host_path": "/tmp", "cpus": null,
        "memory_mb": null, "state": state, "command": ["true"], "env": [], "workdir": null,
        "started_at": null, "exit_code": null, "error": null,
    });
    std::fs::write(dir.join("worker.json"), record.to_string()).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_payloads_never_panic_and_a_running_record_is_restarted() {
    let cache = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    for (vm_id, state_name) in [("w1", "prepared"), ("again", "running")] {
        write_record(state.path(), vm_id, state_name);
    }
    let config =
        json!({"auto_install": false, "image_cache_dir": cache.path(), "state_dir": state.path()});
    let plugin = SandboxPlugin::start(
        "sandbox-test",
        "0",
        &config,
        NoBoot,
        plugin_api::Host::none(),
    )
    .unwrap();

    // The restart ran in the background: no host root is configured in this process, so it
    // failed, and the record says why.
    let mut restarted = None;
    for _ in 0..200 {
        let status = Arc::clone(&plugin)
            .invoke("worker::status".into(), json!({"vm_id": "again"}))
            .await
            .unwrap();
        if status["state"] == "failed" {
            restarted = Some(status);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let restarted = restarted.expect("the running worker was tried again at start-up");
    assert!(
        restarted["error"]
            .as_str()
            .unwrap()
            .contains("III_COMPOSE_DIR"),
        "{restarted}"
    );

    let ops = [
        "prepare", "start", "status", "logs", "stop", "destroy", "nope",
    ];
    let allowed = ["S001", "S002", "S100", "S101", "S501"];
    only_earnable_codes(&plugin, 3000, &allowed, &["S001", "S002", "S501"], |rng| {
        let op = *rng.pick(&ops);
        let payload = if rng.below(3) == 0 {
            VOCABULARY.value(rng, 3)
        } else {
            template(rng, op)
        };
        (format!("worker::{op}"), payload)
    })
    .await;
}
