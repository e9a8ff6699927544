//! Bus-facing parsing under random input: thousands of generated payloads, structured around
//! the real field names and fully random, go through `SandboxPlugin::invoke` for every
//! function. None may panic, and every refusal must carry an S-code the payload can earn
//! without a bootable host (the fake backend refuses to boot; images are never installed).

mod support;

use sandbox_core::SandboxPlugin;
use serde_json::{json, Value};
use support::{only_earnable_codes, NoBoot, Rng, Vocabulary};

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

const VOCABULARY: Vocabulary = Vocabulary {
    fields: FIELDS,
    strings: STRINGS,
    floats: true,
    longest: 5000,
    items: 5,
    members: 6,
};

/// A valid payload for `function`, with one field replaced, removed or added at random.
fn mutated_template(rng: &mut Rng, function: &str) -> Value {
    let payload = match function {
        "create" => json!({"image": "python", "cpus": 1, "env": {"A": "1"}}),
        "exec" => json!({"sandbox_id": "6f1c1a52-7d3e-4b7e-9c55-0a4f2d6e8b10", "argv": ["true"]}),
        "stop" => json!({"sandbox_id": "6f1c1a52-7d3e-4b7e-9c55-0a4f2d6e8b10", "wait": true}),
        "run" => {
            json!({"image": "node", "code": "1", "lang": "js", "files": [{"path": "a", "content": ""}]})
        }
        _ => json!({}),
    };
    VOCABULARY.mutate(rng, payload, 4)
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
    let allowed = ["S001", "S002", "S004", "S100", "S101", "S400"];
    let must_reach = ["S001", "S002", "S100", "S101"];
    only_earnable_codes(&plugin, 6000, &allowed, &must_reach, |rng| {
        let function = *rng.pick(&functions);
        let payload = if rng.below(2) == 0 {
            VOCABULARY.value(rng, 3)
        } else {
            mutated_template(rng, function)
        };
        (function.to_string(), payload)
    })
    .await;
}
