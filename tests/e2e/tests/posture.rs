//! The posture of every host process the adapter starts, checked from the host against an
//! expected table kept as data (`tests/e2e/posture/<backend>-<root|user>.toml`): ids,
//! capability sets and the user namespace they count in, seccomp, `no_new_privs`,
//! namespaces, open descriptors, rlimits, dumpable, and what each does when its parent dies.
//! Any drift fails naming the process and the field. Modelled on gVisor's `sandboxposture`
//! test and Firecracker's jailer tests: what the sandbox's helpers hold is asserted from
//! outside, not trusted from their code.
//!
//! - `bwrap_host_processes_match_their_table`: one adapter on the bwrap plugin with a sandbox
//!   with network (`net`: bwrap, the agent, pasta, the resolver proxy), one without
//!   (`nonet`), a worker VM (`worker`: an ordinary user's adds its FUSE daemons, each in its
//!   bwrap jail) and the pool's waiting launcher (`pool`). As root, or as the ordinary user
//!   of `SANDBOX_E2E_ADAPTER_USER` (scripts/test.sh's second pass): one table each.
//! - `libkrun_host_processes_match_their_table`: the same on the libkrun plugin (the VM
//!   runner and its helpers), where microVMs boot (the VM lab); elsewhere `DID NOT RUN`.
//!
//! `POSTURE_PRINT=1` prints the observed table in the expected file's layout, comments kept
//! (it is printed on any drift too); `POSTURE_PRINT=update` writes it over the file.

mod posture_support;
mod sandbox_support;
mod worker_support;

use std::path::Path;
use std::time::Duration;

use e2e_tests::{adapter_user, bwrap_usable, AdapterOptions, PluginKind, Stack};
use posture_support::describe::Context;
use posture_support::table::{compare, Drift, Process, Table, Value};
use posture_support::{
    add_parent_death, check, observe, parent_death, plant_inherited_pipe, settle, tree,
};
use serde_json::{json, Value as Json};
use worker_support::{compose_options, worker_ok};

/// The worker VM's id (a name no path of the host holds by chance).
const WORKER: &str = "posture-worker";

/// Held by each adapter test for its whole run: one adapter at a time, so that the pipe one
/// test plants for its adapter to inherit is not inherited by the other's, and only one
/// kill is measured at a time (the test process reaps the orphans).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The table for this backend and this adapter's user.
fn table_file(backend: &str) -> String {
    let who = if adapter_user().is_some() {
        "user"
    } else {
        "root"
    };
    format!("{backend}-{who}.toml")
}

/// Why this host cannot run the check, if it cannot.
fn unable() -> Option<String> {
    (!nix::unistd::geteuid().is_root()).then(|| {
        "needs root: it reads other users' /proc entries and probes them with their ids".into()
    })
}

/// A Compose directory the adapter's user owns (the worker VM's host root).
fn compose_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let project = e2e_tests::host_dir();
    let compose = project.path().join("compose");
    std::fs::create_dir(&compose).expect("compose dir");
    if let Some(user) = adapter_user() {
        std::os::unix::fs::chown(&compose, Some(user.uid), Some(user.gid)).unwrap();
    }
    (project, compose)
}

/// Configuration: one resolver (the proxy opens its sockets per resolver: the host's own
/// list would make their count the host's), and for an ordinary user's adapter without a
/// delegated cgroup, sandboxes allowed unbounded (limits are not what this test is about).
fn config() -> Json {
    let delegated = std::env::var("SANDBOX_E2E_ADAPTER_CGROUPS").is_ok_and(|g| !g.is_empty());
    let mut config = json!({"network_dns": ["127.0.0.1:53"]});
    if adapter_user().is_some() && !delegated {
        config["allow_unbounded_sandboxes"] = json!(true);
    }
    config
}

/// The adapter's child that appeared as `group`'s root process (one its tree did not have
/// among `known`), waiting up to 20 s.
async fn new_root(stack: &Stack, known: &[(String, u32)], program: &str) -> u32 {
    for _ in 0..200 {
        let fresh: Vec<u32> = tree::processes()
            .into_iter()
            .filter(|(pid, (ppid, _, exe))| {
                *ppid == stack.adapter.pid()
                    && tree::program(exe) == program
                    && !known.iter().any(|(_, k)| k == pid)
            })
            .map(|(pid, _)| pid)
            .collect();
        if let [pid] = fresh.as_slice() {
            return *pid;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no new {program} under the adapter\n{}",
        stack.adapter.log()
    );
}

/// A sandbox's open-file limit as `adapter::info` states it (`soft:hard`).
async fn sandbox_nofile(stack: &Stack) -> Option<String> {
    let info = stack.call("adapter::info", json!({})).await.ok()?;
    let files = &info["backend"]["isolation"]["ceilings"]["open_files"];
    Some(format!(
        "{}:{}",
        files["soft"].as_u64()?,
        files["hard"].as_u64()?
    ))
}

/// The symbols of this run.
fn context(stack: &Stack, compose: &Path, ids: &[(&str, &str)]) -> Context {
    let mut paths = vec![
        (
            stack.state_dir.path().display().to_string(),
            "{state}".to_string(),
        ),
        (
            e2e_tests::shared_cache_dir().display().to_string(),
            "{cache}".into(),
        ),
        (e2e_tests::bin_dir().display().to_string(), "{bin}".into()),
        (compose.display().to_string(), "{compose}".into()),
        (
            e2e_tests::agent_bin().display().to_string(),
            "{agent}".into(),
        ),
        (
            e2e_tests::repo_root()
                .canonicalize()
                .unwrap_or_else(|_| e2e_tests::repo_root())
                .display()
                .to_string(),
            "{repo}".into(),
        ),
    ];
    if let Some(user) = adapter_user() {
        paths.push((user.home.display().to_string(), "{home}".into()));
    }
    let engine_port = stack
        .engine
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(0);
    Context {
        paths,
        names: ids
            .iter()
            .map(|(id, symbol)| (id.to_string(), symbol.to_string()))
            .collect(),
        engine_port,
        sandbox_nofile: None,
        gate: Vec::new(),
    }
}

/// The gate's link addresses `adapter::info` names, as `{gate_v4}` and `{gate_v6}`.
async fn gate_addresses(stack: &Stack) -> Vec<(String, String)> {
    let Ok(info) = stack.call("adapter::info", json!({})).await else {
        return Vec::new();
    };
    let gate = &info["backend"]["isolation"]["network"]["link"]["gate"];
    ["{gate_v4}", "{gate_v6}"]
        .iter()
        .enumerate()
        .filter_map(|(i, symbol)| Some((gate[i].as_str()?.to_string(), symbol.to_string())))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn bwrap_host_processes_match_their_table() {
    let test = "bwrap_host_processes_match_their_table";
    if !bwrap_usable(test) {
        return;
    }
    if let Some(why) = unable() {
        println!("\n*** {test} DID NOT RUN: {why} ***\n");
        return;
    }
    let _serial = SERIAL.lock().await;
    let file = table_file("bwrap");
    let (_project, compose) = compose_dir();
    let _planted = plant_inherited_pipe();
    let mut stack = Stack::start(config(), compose_options(&compose)).await;
    let mut groups: Vec<(String, u32)> = Vec::new();

    let net = sandbox_support::create(&stack, "python", json!({"network": true})).await;
    groups.push(("net".into(), new_root(&stack, &groups, "bwrap").await));
    let nonet = sandbox_support::create(&stack, "python", json!({})).await;
    groups.push(("nonet".into(), new_root(&stack, &groups, "bwrap").await));
    worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": WORKER, "image": "python", "host_path": compose}),
    )
    .await;
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": WORKER, "command": ["sleep", "100000"]}),
    )
    .await;
    groups.push(("worker".into(), new_root(&stack, &groups, "bwrap").await));
    let adapter = stack.adapter.pid();
    settle(adapter, &groups, Duration::from_secs(20));

    let context = Context {
        sandbox_nofile: sandbox_nofile(&stack).await,
        gate: gate_addresses(&stack).await,
        ..context(
            &stack,
            &compose,
            &[(&net, "{net}"), (&nonet, "{nonet}"), (WORKER, "{worker}")],
        )
    };
    let (mut observed, watched) = observe(adapter, &groups, &context);
    let outcome = parent_death::measure(&watched, || stack.adapter.kill9());
    add_parent_death(&mut observed, &outcome);
    check(&file, &observed);
}

#[tokio::test(flavor = "multi_thread")]
async fn libkrun_host_processes_match_their_table() {
    let test = "libkrun_host_processes_match_their_table";
    if let Some(why) = unable() {
        println!("\n*** {test} DID NOT RUN: {why} ***\n");
        return;
    }
    let _serial = SERIAL.lock().await;
    let file = table_file("libkrun");
    let (_project, compose) = compose_dir();
    let _planted = plant_inherited_pipe();
    let options = AdapterOptions {
        plugin: PluginKind::Libkrun,
        prefix: None,
        ..compose_options(&compose)
    };
    let mut stack = Stack::start(config(), options).await;
    let info = stack
        .call("adapter::info", json!({}))
        .await
        .expect("adapter::info");
    if info["backend"]["ready"] != true {
        let expected = std::env::var("SANDBOX_EXPECT_MICROVMS").is_ok_and(|v| v == "1");
        let reason = info["backend"]["reason"].as_str().unwrap_or("").to_string();
        assert!(
            !expected,
            "SANDBOX_EXPECT_MICROVMS=1 but the libkrun backend refuses: {reason}"
        );
        println!(
            "\n*** {test} DID NOT RUN: no microVM boots here ({reason}); the VM lab runs it \
             (tests/vm-lab/libkrun-e2e.sh) against tests/e2e/posture/{file} ***\n"
        );
        return;
    }
    let mut groups: Vec<(String, u32)> = Vec::new();
    let runner = "sandbox-libkrun-vm";
    let net = sandbox_support::create(&stack, "python", json!({"network": true})).await;
    groups.push(("net".into(), new_root(&stack, &groups, runner).await));
    let nonet = sandbox_support::create(&stack, "python", json!({})).await;
    groups.push(("nonet".into(), new_root(&stack, &groups, runner).await));
    worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": WORKER, "image": "python", "host_path": compose}),
    )
    .await;
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": WORKER, "command": ["sleep", "100000"]}),
    )
    .await;
    groups.push(("worker".into(), new_root(&stack, &groups, runner).await));
    let adapter = stack.adapter.pid();
    settle(adapter, &groups, Duration::from_secs(60));

    let context = Context {
        sandbox_nofile: sandbox_nofile(&stack).await,
        ..context(
            &stack,
            &compose,
            &[(&net, "{net}"), (&nonet, "{nonet}"), (WORKER, "{worker}")],
        )
    };
    let (mut observed, watched) = observe(adapter, &groups, &context);
    let outcome = parent_death::measure(&watched, || stack.adapter.kill9());
    add_parent_death(&mut observed, &outcome);
    check(&file, &observed);
}

/// A process as a table holds it, for the comparison's own tests.
fn pasta(cap_eff: &[&str]) -> Process {
    let mut p = Process::new("net.pasta");
    p.set("uids", Value::text("adapter adapter adapter adapter"));
    p.set(
        "cap_eff",
        Value::List(cap_eff.iter().map(|c| c.to_string()).collect()),
    );
    p
}

#[test]
fn one_more_capability_fails_naming_the_process_and_the_field() {
    let expected = Table {
        header: Vec::new(),
        processes: vec![pasta(&[])],
    };
    assert_eq!(compare(&expected, &expected.clone()), Vec::<Drift>::new());
    let observed = Table {
        header: Vec::new(),
        processes: vec![pasta(&["CAP_NET_RAW"])],
    };
    let drifts = compare(&expected, &observed);
    assert_eq!(drifts.len(), 1, "{drifts:?}");
    let shown = drifts[0].to_string();
    assert!(
        shown.contains("process net.pasta") && shown.contains("field cap_eff"),
        "{shown}"
    );
    assert!(shown.contains("extra [\"CAP_NET_RAW\"]"), "{shown}");
}

#[test]
fn a_process_added_or_missing_fails_naming_it() {
    let expected = Table {
        header: Vec::new(),
        processes: vec![pasta(&[])],
    };
    let mut forwarder = Process::new("net.forwarder");
    forwarder.set("uids", Value::text("root root root root"));
    let observed = Table {
        header: Vec::new(),
        processes: vec![forwarder],
    };
    let shown: Vec<String> = compare(&expected, &observed)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        [
            "process net.pasta: expected, not found",
            "process net.forwarder: found, not in the table"
        ]
    );
}

/// Every table in the repository parses, and each of its processes has every field the test
/// observes (a hand edit that drops or misspells one fails here, not only on the host that
/// runs it).
#[test]
fn every_expected_table_is_complete() {
    const FIELDS: [&str; 25] = [
        "parent",
        "program",
        "uids",
        "gids",
        "groups",
        "userns",
        "userns_parent",
        "userns_owner",
        "uid_map",
        "gid_map",
        "cap_eff",
        "cap_prm",
        "cap_inh",
        "cap_bnd",
        "cap_amb",
        "seccomp",
        "no_new_privs",
        "ns",
        "root",
        "cwd",
        "fds",
        "rlimits",
        "dumpable",
        "threads",
        "parent_death",
    ];
    for file in [
        "bwrap-root.toml",
        "bwrap-user.toml",
        "libkrun-root.toml",
        "libkrun-user.toml",
    ] {
        let path = posture_support::table_path(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let table = Table::parse(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!table.processes.is_empty(), "{file} lists no process");
        for process in &table.processes {
            let keys: Vec<&str> = process.fields.iter().map(|f| f.key.as_str()).collect();
            assert_eq!(keys, FIELDS, "{file}: [{}]", process.role);
        }
    }
}
