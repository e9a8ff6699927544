//! Adapters sharing one host (bwrap plugin): each touches only the cgroups it made, so an
//! adapter starting up never removes the group another adapter made for its waiting launcher,
//! and every sandbox of each stays bounded: a memory bomb dies with 137 in each, 20 rounds in
//! a row. A launcher whose group is gone would be a sandbox without limits; the limits now
//! fail closed (S300), so a create that succeeds is a bounded one.
//!
//! To make "another adapter's launcher waits in its pool" certain rather than lucky, the
//! adapters start their launchers through a gate (`SANDBOX_BWRAP_LAUNCH` pointing at a script
//! that waits while a file exists, then execs the real launcher): while the gate is closed,
//! a launcher's group is made and still empty, the moment another adapter's start-up sweep
//! used to remove it.

mod sandbox_support;

use std::path::PathBuf;
use std::time::Duration;

use e2e_tests::{bin_dir, bwrap_usable, AdapterOptions, Stack};
use sandbox_support::{create, descendants, eventually, exec_ok, stdout, stop};
use serde_json::{json, Value};

const ROUNDS: usize = 20;
/// The boot default of these adapters: what the warm pool boots and the bomb outgrows.
const MEMORY_MB: u32 = 128;
/// The gate script's name: a waiting launcher's `comm` until it execs the real one.
const GATE: &str = "gated-launch";

/// Touches every page, 16 MiB at a time, far past `MEMORY_MB`.
const BOMB: &str =
    "chunks = []\nfor _ in range(64):\n    chunks.append(b'\\x01' * (16 << 20))\nprint('survived')";

/// A gate in front of the launcher: `hold` closes it while it exists.
struct Gate {
    dir: tempfile::TempDir,
}

impl Gate {
    fn new() -> Gate {
        use std::os::unix::fs::PermissionsExt;
        let dir = e2e_tests::host_dir();
        let launcher = bin_dir().join("sandbox-bwrap-launch");
        let hold = dir.path().join("hold");
        let script = format!(
            "#!/bin/sh\nwhile [ -e '{}' ]; do sleep 0.02; done\nexec '{}' \"$@\"\n",
            hold.display(),
            launcher.display()
        );
        let path = dir.path().join(GATE);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Gate { dir }
    }

    fn script(&self) -> PathBuf {
        self.dir.path().join(GATE)
    }

    fn close(&self) {
        std::fs::write(self.dir.path().join("hold"), "").unwrap();
    }

    fn open(&self) {
        let _ = std::fs::remove_file(self.dir.path().join("hold"));
    }
}

/// A bwrap adapter whose launchers pass `gate`; `pooled`: one pooled sandbox of `MEMORY_MB`.
async fn start(gate: &Gate, pooled: bool) -> Stack {
    let options = AdapterOptions {
        env: vec![(
            "SANDBOX_BWRAP_LAUNCH".into(),
            gate.script().display().to_string(),
        )],
        ..AdapterOptions::default()
    };
    let pool = if pooled {
        json!({"python": 1})
    } else {
        json!({})
    };
    Stack::start(
        json!({"warm_pool": pool, "default_memory_mb": MEMORY_MB}),
        options,
    )
    .await
}

/// Whether sandboxes' memory is bounded here; prints why `test` did not run when not.
async fn memory_bounded(stack: &Stack, test: &str) -> bool {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let in_force = &info["backend"]["isolation"]["limits_in_force"];
    let bounded = in_force
        .as_array()
        .is_some_and(|all| all.iter().any(|l| l == "memory"));
    if !bounded {
        println!(
            "\n*** {test} DID NOT RUN: sandboxes' memory is not bounded on this host (limits_in_force: {in_force}; an ordinary user's adapter without a delegated cgroup) ***\n"
        );
    }
    bounded
}

/// `stack`'s adapter's launchers: (waiting at the gate, past it and waiting for a command).
/// A launcher that got its command has become bwrap.
fn launchers(stack: &Stack) -> (usize, usize) {
    let children = descendants(stack.adapter.pid());
    let count = |comm: &str| children.iter().filter(|p| p.comm == comm).count();
    // `comm` holds 15 bytes of the name.
    (count(GATE), count("sandbox-bwrap-l"))
}

/// Waits until `ready(gated, past)` holds for `stack`'s launchers.
async fn wait_launchers(stack: &Stack, what: &str, ready: impl Fn((usize, usize)) -> bool) {
    let seen = eventually(Duration::from_secs(30), || async {
        ready(launchers(stack))
    })
    .await;
    assert!(
        seen,
        "{what}: launchers (at the gate, past it) {:?}\n{}",
        launchers(stack),
        stack.adapter.log()
    );
}

/// Creates a sandbox with `extra` and runs the bomb in it: the bomb, not the agent, is the
/// OOM killer's victim (the sandbox's group holds its memory limit).
async fn bomb_dies(stack: &Stack, extra: Value, what: &str) {
    let id = create(stack, "python", extra.clone()).await;
    let result = exec_ok(
        stack,
        &id,
        json!({"argv": ["python3", "-c", BOMB], "timeout_ms": 60_000}),
    )
    .await;
    assert_eq!(
        result["exit_code"],
        137,
        "{what}, sandbox {id} {extra}: the memory bomb dies: {result}\n{}",
        stack.adapter.log()
    );
    assert_ne!(stdout(&result), "survived\n", "{result}");
    stop(stack, &id, false).await;
}

/// The start-up of one adapter while another's launcher waits in its pool, its group made
/// and still empty: the waiting one is left alone, and the sandbox it then starts is bounded
/// (as are the new adapter's), 20 rounds in a row.
#[tokio::test(flavor = "multi_thread")]
async fn an_adapter_starting_leaves_another_adapters_waiting_launcher_alone() {
    let test = "an_adapter_starting_leaves_another_adapters_waiting_launcher_alone";
    if !bwrap_usable(test) {
        return;
    }
    let gate = Gate::new();
    let first = start(&gate, false).await;
    if !memory_bounded(&first, test).await {
        return;
    }
    for round in 1..=ROUNDS {
        let what = format!("round {round}");
        // A create starts the spare launcher ahead of the next: wait until it is past the
        // gate (then closing it cannot hold this round's first create).
        bomb_dies(&first, json!({}), &what).await;
        wait_launchers(&first, &what, |(gated, past)| gated == 0 && past >= 1).await;
        gate.close();
        // This create takes the spare launcher; the next one now waits at the gate.
        bomb_dies(&first, json!({}), &what).await;
        wait_launchers(&first, &what, |(gated, _)| gated >= 1).await;
        let second = start(&gate, false).await;
        gate.open();
        bomb_dies(
            &first,
            json!({}),
            &format!("{what}, the adapter whose launcher waited"),
        )
        .await;
        bomb_dies(
            &second,
            json!({}),
            &format!("{what}, the adapter that started"),
        )
        .await;
    }
}

/// Two adapters started at the same moment, each with a pooled sandbox and a spare launcher
/// waiting at the gate while the other starts: every sandbox of each is bounded (the pooled
/// one and one booted on the create), 20 rounds in a row.
#[tokio::test(flavor = "multi_thread")]
async fn two_adapters_started_at_once_bound_every_sandbox() {
    let test = "two_adapters_started_at_once_bound_every_sandbox";
    if !bwrap_usable(test) {
        return;
    }
    let gate = Gate::new();
    for round in 1..=ROUNDS {
        let what = format!("round {round}");
        gate.close();
        let (a, b) = tokio::join!(start(&gate, true), start(&gate, true));
        if round == 1 && !memory_bounded(&a, test).await {
            gate.open();
            return;
        }
        wait_launchers(&a, &what, |(gated, _)| gated >= 2).await;
        wait_launchers(&b, &what, |(gated, _)| gated >= 2).await;
        gate.open();
        let both = |stack, name: &'static str| {
            let what = format!("{what}, {name} adapter");
            async move {
                // From the pool (its boot waited at the gate), then one booted now.
                bomb_dies(stack, json!({}), &what).await;
                bomb_dies(stack, json!({"memory_mb": MEMORY_MB - 1}), &what).await;
            }
        };
        tokio::join!(both(&a, "first"), both(&b, "second"));
    }
}

/// A launcher whose group is gone (removed before the launcher joins it): the sandbox is not
/// started, S300 naming the limit that could not be written or the group that could not be
/// joined (before: the failed join was ignored and the sandbox ran without limits).
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_whose_group_is_gone_is_not_started() {
    use std::os::unix::fs::PermissionsExt;
    let test = "a_sandbox_whose_group_is_gone_is_not_started";
    if !bwrap_usable(test) {
        return;
    }
    let dir = e2e_tests::host_dir();
    let script = dir.path().join("ungrouped-launch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in */cgroup.procs) rmdir \"${{a%/cgroup.procs}}\";; esac; done\nexec '{}' \"$@\"\n",
            bin_dir().join("sandbox-bwrap-launch").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let options = AdapterOptions {
        env: vec![("SANDBOX_BWRAP_LAUNCH".into(), script.display().to_string())],
        ..AdapterOptions::default()
    };
    let stack = Stack::start(json!({}), options).await;
    if !memory_bounded(&stack, test).await {
        return;
    }
    for round in 0..3 {
        let (code, body) = sandbox_support::expect_err(
            stack.call("create", json!({"image": "python"})).await,
            "create whose group is gone",
        );
        let message = body["message"].as_str().unwrap_or_default();
        println!("round {round}: {message}");
        assert_eq!(code, "S300", "{body}");
        assert!(
            message.contains("cannot set the sandbox's")
                || message.contains("cannot join the sandbox's cgroup"),
            "names the limit or the group: {body}"
        );
    }
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["sandboxes"], json!([]), "{list}");
    assert_eq!(list["in_flight"], 0, "{list}");
}
