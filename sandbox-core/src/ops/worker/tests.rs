//! `worker::*` through `SandboxPlugin::invoke` without a bootable host: random payloads never
//! panic and earn only the codes they can, and a worker recorded as running is started again
//! at start-up (here it fails, and says why, since no host root is configured).

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use plugin_api::Plugin;
use serde_json::{json, Map, Value};

use super::record::{WorkerDirs, WorkerRecord, WorkerState};
use crate::backend::{Backend, BootSpec, Booted, HostUnfit};
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;

struct NoBoot;

#[async_trait]
impl Backend for NoBoot {
    fn name(&self) -> &'static str {
        "none"
    }
    fn probe(&self) -> Result<(), HostUnfit> {
        Ok(())
    }
    async fn boot(&self, _spec: &BootSpec) -> Result<Booted, SandboxError> {
        Err(SandboxError::BootFailed("test backend never boots".into()))
    }
}

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

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

fn random_value(rng: &mut Rng, depth: u32) -> Value {
    match rng.below(if depth == 0 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(rng.next() as i64 >> rng.below(64)),
        3 => Value::String(rng.pick(STRINGS).to_string()),
        4 => Value::String("x".repeat(rng.below(300) as usize)),
        5 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut object = Map::new();
            for _ in 0..rng.below(5) {
                object.insert(rng.pick(FIELDS).to_string(), random_value(rng, depth - 1));
            }
            Value::Object(object)
        }
    }
}

fn template(rng: &mut Rng, op: &str) -> Value {
    let vm_id = *rng.pick(&["w1", "ghost"]);
    let mut payload = match op {
        "prepare" => json!({"vm_id": vm_id, "image": "python", "host_path": "/tmp"}),
        "start" => json!({"vm_id": vm_id, "command": ["/bin/sh", "-c", "true"], "env": {"A": "1"}}),
        "logs" => json!({"vm_id": vm_id, "max_bytes": 10}),
        "stop" => json!({"vm_id": vm_id, "timeout_ms": 1}),
        _ => json!({ "vm_id": vm_id }),
    };
    if let Some(object) = payload.as_object_mut() {
        let field = rng.pick(FIELDS).to_string();
        match rng.below(3) {
            0 => {}
            1 => {
                object.remove(&field);
            }
            _ => {
                object.insert(field, random_value(rng, 2));
            }
        }
    }
    payload
}

fn record(vm_id: &str, state: WorkerState) -> WorkerRecord {
    WorkerRecord {
        vm_id: vm_id.into(),
        image: "python".into(),
        host_path: "/tmp".into(),
        cpus: None,
        memory_mb: None,
        state,
        command: vec!["true".into()],
        env: Vec::new(),
        workdir: None,
        started_at: None,
        exit_code: None,
        error: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_payloads_never_panic_and_a_running_record_is_restarted() {
    let cache = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let dirs = WorkerDirs::open(state.path()).unwrap();
    for (vm_id, state) in [
        ("w1", WorkerState::Prepared),
        ("again", WorkerState::Running),
    ] {
        dirs.create(vm_id).unwrap();
        dirs.save(&record(vm_id, state)).unwrap();
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
    let allowed: BTreeSet<&str> = ["S001", "S002", "S100", "S101", "S501"].into();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut seen = BTreeSet::new();
    for round in 0..3000 {
        let op = *rng.pick(&ops);
        let payload = if rng.below(3) == 0 {
            random_value(&mut rng, 3)
        } else {
            template(&mut rng, op)
        };
        let outcome = Arc::clone(&plugin)
            .invoke(format!("worker::{op}"), payload.clone())
            .await;
        if let Err(body) = outcome {
            assert!(
                allowed.contains(body.code.as_str()),
                "round {round}: {op} {payload} -> {body:?}"
            );
            seen.insert(body.code);
        }
    }
    for code in ["S001", "S002", "S501"] {
        assert!(
            seen.contains(code),
            "the generator must reach {code}: {seen:?}"
        );
    }
}
