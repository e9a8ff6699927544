//! Bus-facing parsing under random input: thousands of generated payloads, structured around
//! the real field names and fully random, go through `SandboxPlugin::invoke` for every
//! function. None may panic, and every refusal must carry an S-code the payload can earn
//! without a bootable host (the fake backend refuses to boot; images are never installed).

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use plugin_api::Plugin;
use sandbox_core::{Backend, BootSpec, Booted, HostUnfit, SandboxError, SandboxPlugin};
use serde_json::{json, Map, Value};

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
    "image",
    "cpus",
    "memory_mb",
    "name",
    "network",
    "idle_timeout_secs",
    "env",
    "sandbox_id",
    "argv",
    "cmd",
    "args",
    "stdin",
    "timeout_ms",
    "workdir",
    "wait",
    "code",
    "lang",
    "files",
    "keep_sandbox",
    "path",
    "content",
    "_caller_worker_id",
];

const STRINGS: &[&str] = &[
    "",
    "python",
    "node",
    "sh",
    "/bin/sh",
    "a b",
    "echo 'open",
    "\0",
    "K=V",
    "=x",
    "aGk=",
    "***",
    "00000000-0000-0000-0000-000000000000",
    "not-a-uuid",
    "/tmp",
    "relative",
    "\u{1F600}",
    "\\",
];

fn random_value(rng: &mut Rng, depth: u32) -> Value {
    match rng.below(if depth == 0 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(rng.next() as i64 >> rng.below(64)),
        3 => json!((rng.next() as f64) / 7.0 - 1e18),
        4 => Value::String(rng.pick(STRINGS).to_string()),
        5 => Value::String("x".repeat(rng.below(5000) as usize)),
        6 => Value::Array(
            (0..rng.below(5))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut object = Map::new();
            for _ in 0..rng.below(6) {
                object.insert(rng.pick(FIELDS).to_string(), random_value(rng, depth - 1));
            }
            Value::Object(object)
        }
    }
}

/// A valid payload for `function`, with one field replaced, removed or added at random.
fn mutated_template(rng: &mut Rng, function: &str) -> Value {
    let mut payload = match function {
        "create" => json!({"image": "python", "cpus": 1, "env": {"A": "1"}}),
        "exec" => json!({"sandbox_id": "6f1c1a52-7d3e-4b7e-9c55-0a4f2d6e8b10", "argv": ["true"]}),
        "stop" => json!({"sandbox_id": "6f1c1a52-7d3e-4b7e-9c55-0a4f2d6e8b10", "wait": true}),
        "run" => {
            json!({"image": "node", "code": "1", "lang": "js", "files": [{"path": "a", "content": ""}]})
        }
        _ => json!({}),
    };
    if let Some(object) = payload.as_object_mut() {
        let field = rng.pick(FIELDS).to_string();
        match rng.below(4) {
            0 => {} // left valid
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

#[tokio::test(flavor = "multi_thread")]
async fn random_payloads_never_panic_and_get_s_codes() {
    let cache = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let config =
        json!({"auto_install": false, "image_cache_dir": cache.path(), "state_dir": state.path()});
    // Any existing file stands for the agent: the fake backend never runs it.
    std::env::set_var(
        sandbox_core::plugin::AGENT_PATH_ENV,
        std::env::current_exe().unwrap(),
    );
    let plugin = SandboxPlugin::start(
        "sandbox-test",
        "0",
        &config,
        NoBoot,
        plugin_api::Host::none(),
    )
    .unwrap();
    let functions = [
        "create",
        "exec",
        "stop",
        "list",
        "run",
        "catalog::list",
        "adapter::info",
        "nope",
    ];
    // Codes a payload can earn here: bad input, unknown/stopped sandbox, image verdicts, caps.
    let allowed: BTreeSet<&str> = ["S001", "S002", "S004", "S100", "S101", "S400"].into();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut seen = BTreeSet::new();
    for round in 0..6000 {
        let function = *rng.pick(&functions);
        let payload = if rng.below(2) == 0 {
            random_value(&mut rng, 3)
        } else {
            mutated_template(&mut rng, function)
        };
        let outcome = Arc::clone(&plugin)
            .invoke(function.to_string(), payload.clone())
            .await;
        if let Err(body) = outcome {
            assert!(
                allowed.contains(body.code.as_str()),
                "round {round}: {function} {payload} -> {body:?}"
            );
            seen.insert(body.code);
        }
    }
    println!("codes seen: {seen:?}");
    for code in ["S001", "S002", "S100", "S101"] {
        assert!(
            seen.contains(code),
            "the generator must reach {code}: {seen:?}"
        );
    }
}
