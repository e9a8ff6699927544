//! Disk limits on the bwrap plugin: a sandbox's writable layer holds
//! `default_disk_mb` and no more: past it the sandbox sees ENOSPC, the host's state
//! filesystem did not pay for it, and the sandbox keeps serving; `/tmp` likewise. A worker
//! VM's persistent layer (an ext4 image: a loop device, or FUSE for an ordinary user) is bounded the same way and keeps
//! what was written across starts, its `/state` in the same image. Bad values stop the
//! adapter with exit 2 naming the key.

mod sandbox_support;
mod worker_support;

use std::time::Duration;

use e2e_tests::{bwrap_usable, Adapter, AdapterOptions, Stack};
use iii_test_engine::Engine;
use sandbox_support::disk_fill::{filler, number, paid_bytes};
use sandbox_support::{create, exec_ok, sh, stdout};
use serde_json::json;
use worker_support::{compose_options, wait_log, worker_ok};

const DISK_MB: u64 = 64;
/// What the adapter's state directory may grow by while a sandbox fills its layer (logs,
/// the layer's directories). Each test counts only its own adapter's state directory
/// (`paid_bytes`): the host's free space also counted other adapters' writes (a clean-clone
/// CI run saw the worker test's 52 MiB charged to the sandbox's /tmp; a run beside other
/// adapters failed the same way).
const SLACK_MB: u64 = 48;

/// Held by each test that fills tens of MiB, so that two fills never compete for a small
/// host disk.
static HOST_DISK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_filling_its_layer_or_tmp_gets_enospc_and_the_host_pays_nothing() {
    let test = "a_sandbox_filling_its_layer_or_tmp_gets_enospc_and_the_host_pays_nothing";
    if !bwrap_usable(test) {
        return;
    }
    let _alone = HOST_DISK.lock().await;
    let stack = Stack::start(json!({"default_disk_mb": DISK_MB}), Default::default()).await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let isolation = &info["backend"]["isolation"];
    println!("disk: {}", isolation["disk"]);
    assert!(
        isolation["limits_in_force"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l == "disk")),
        "{isolation}"
    );
    let id = create(&stack, "python", json!({})).await;
    let state = stack.state_dir.path();
    for target in ["/fill", "/tmp/fill", "/root/deeper/fill"] {
        let before = paid_bytes(state);
        let script = if target.contains("deeper") {
            "import os; os.makedirs('/root/deeper', exist_ok=True)\n".to_string() + &filler(target)
        } else {
            filler(target)
        };
        let result = exec_ok(
            &stack,
            &id,
            json!({"argv": ["python3", "-c", script], "timeout_ms": 120_000}),
        )
        .await;
        let after = paid_bytes(state);
        let out = stdout(&result).to_string();
        let lost_mb = after.saturating_sub(before) >> 20;
        println!(
            "{target}: {} ; the adapter's state directory took {} MiB, then {} MiB",
            out.replace('\n', " "),
            before >> 20,
            after >> 20
        );
        assert!(out.contains("errno 28 ENOSPC"), "{target}: ENOSPC: {out}");
        assert!(
            number(&out, "written_mb ") <= DISK_MB,
            "{target}: at most {DISK_MB} MiB: {out}"
        );
        assert!(
            lost_mb < SLACK_MB,
            "{target}: the host's filesystem lost {lost_mb} MiB"
        );
        // Still serving; and space comes back once the file is gone.
        let echo = exec_ok(&stack, &id, json!({"argv": ["echo", "ok"]})).await;
        assert_eq!(stdout(&echo), "ok\n");
        let again = exec_ok(
            &stack,
            &id,
            sh(&format!(
                "rm {target} && head -c 1048576 /dev/zero > {target} && wc -c < {target} && rm {target}"
            )),
        )
        .await;
        assert_eq!(stdout(&again).trim(), "1048576", "{again}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_disk_values_stop_the_adapter_naming_the_key() {
    let cases = [
        (json!({"default_disk_mb": 0}), "`default_disk_mb`"),
        (json!({"max_disk_mb": "lots"}), "`max_disk_mb`"),
        (json!({"default_disk_mb": -3}), "`default_disk_mb`"),
        (
            json!({"default_disk_mb": 100, "max_disk_mb": 50}),
            "`default_disk_mb`: 100 is above `max_disk_mb` (50)",
        ),
    ];
    let mut builder = Engine::builder();
    for (index, (value, _)) in cases.iter().enumerate() {
        builder = builder.with_config(format!("disk-case-{index}"), value.clone());
    }
    let engine = builder
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine");
    let mut adapters: Vec<_> = (0..cases.len())
        .map(|index| {
            let options = AdapterOptions {
                prefix: Some(format!("disk-case-{index}")),
                worker_name: format!("disk-case-{index}"),
                config_name: format!("disk-case-{index}"),
                ..AdapterOptions::default()
            };
            Adapter::spawn(&engine.url(), &options)
        })
        .collect();
    for (adapter, (value, expected)) in adapters.iter_mut().zip(&cases) {
        let status = adapter
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{value}: the adapter still runs\n{}", adapter.log()));
        let log = adapter.log();
        assert_eq!(status.code(), Some(2), "{value}: {log}");
        assert!(log.contains(expected), "{value}: {expected} in {log}");
        assert!(!log.contains("panicked"), "{value}: {log}");
    }
}

/// A stack of `default_disk_mb` DISK_MB serving a Compose project, holding the host's disk.
struct WorkerDisk {
    project: tempfile::TempDir,
    stack: Stack,
    /// What `adapter::info` says of the bound (`disk.<key>`).
    how: String,
    _alone: tokio::sync::MutexGuard<'static, ()>,
}

/// A [`WorkerDisk`] where `adapter::info`'s `disk.<key>` says it is bounded here; none where
/// it is not (the test then says it did not run).
async fn bounded_worker_disk(test: &str, key: &str) -> Option<WorkerDisk> {
    if !bwrap_usable(test) {
        return None;
    }
    let _alone = HOST_DISK.lock().await;
    let project = e2e_tests::host_dir();
    let options = compose_options(project.path());
    let stack = Stack::start(json!({"default_disk_mb": DISK_MB}), options).await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let how = info["backend"]["isolation"]["disk"][key]
        .as_str()
        .unwrap_or_default();
    if how.starts_with("NOT bounded") {
        println!("\n*** {test} DID NOT RUN: {how} ***\n");
        return None;
    }
    Some(WorkerDisk {
        how: how.to_string(),
        project,
        stack,
        _alone,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_layer_is_bounded_and_keeps_its_files_across_starts() {
    let test = "a_worker_layer_is_bounded_and_keeps_its_files_across_starts";
    let Some(WorkerDisk {
        project,
        stack,
        _alone,
        ..
    }) = bounded_worker_disk(test, "worker_layers").await
    else {
        return;
    };
    let vm = json!({"vm_id": "disk", "image": "python", "host_path": project.path()});
    worker_ok(&stack, "prepare", vm).await;
    let state = stack.state_dir.path();
    let before = paid_bytes(state);
    let script = format!(
        "{}\nopen('/opt-kept', 'w').write('kept')\nprint('done-filling', flush=True)\nimport time\ntime.sleep(600)\n",
        filler("/fill")
    );
    let start = json!({"vm_id": "disk", "command": ["python3", "-c", script]});
    worker_ok(&stack, "start", start.clone()).await;
    let log = wait_log(&stack, "disk", "done-filling", 1, Duration::from_secs(120)).await;
    let lost_mb = paid_bytes(state).saturating_sub(before) >> 20;
    println!(
        "worker: {} ; the host lost {lost_mb} MiB",
        log.replace('\n', " ")
    );
    assert!(log.contains("errno 28 ENOSPC"), "{log}");
    assert!(number(&log, "written_mb ") <= DISK_MB, "{log}");
    // The image file holds at most its size; the host may pay up to that, not more.
    assert!(lost_mb < DISK_MB + SLACK_MB, "the host lost {lost_mb} MiB");
    worker_ok(&stack, "stop", json!({"vm_id": "disk", "timeout_ms": 2000})).await;
    let check = json!({"vm_id": "disk", "command": ["/bin/sh", "-c", "cat /opt-kept; echo; echo checked; sleep 600"]});
    worker_ok(&stack, "start", check).await;
    let log = wait_log(&stack, "disk", "checked", 1, Duration::from_secs(60)).await;
    assert!(log.contains("kept\nchecked"), "the layer persisted: {log}");
    // FUSE-served layers: the stop let the daemons write the image out and exit cleanly.
    let layer = stack.state_dir.path().join("workers/disk/layer");
    let sandbox_log = std::fs::read_to_string(layer.join("sandbox.log")).unwrap_or_default();
    assert!(
        !sandbox_log.contains("was not clean"),
        "an orderly stop left the image clean: {sandbox_log}"
    );
    worker_ok(&stack, "stop", json!({"vm_id": "disk", "timeout_ms": 2000})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_state_shares_its_bounded_layer_and_outlives_restarts() {
    let test = "a_worker_state_shares_its_bounded_layer_and_outlives_restarts";
    let Some(WorkerDisk {
        project,
        stack,
        _alone,
        ..
    }) = bounded_worker_disk(test, "worker_state").await
    else {
        return;
    };
    let state = stack.state_dir.path();
    let host_state = |vm_id: &str| state.join("workers").join(vm_id).join("data");

    // Filling /state meets the layer's bound, the host pays at most the image; what the
    // worker keeps in /state is there at its next start, and never in the host directory.
    let vm = json!({"vm_id": "state", "image": "python", "host_path": project.path()});
    worker_ok(&stack, "prepare", vm).await;
    let before = paid_bytes(state);
    let script = format!(
        "open('/state/kept', 'w').write('kept')\n{}\nprint('done-filling', flush=True)\nimport time\ntime.sleep(600)\n",
        filler("/state/fill")
    );
    let start = json!({"vm_id": "state", "command": ["python3", "-c", script]});
    worker_ok(&stack, "start", start).await;
    let log = wait_log(&stack, "state", "done-filling", 1, Duration::from_secs(120)).await;
    let lost_mb = paid_bytes(state).saturating_sub(before) >> 20;
    println!(
        "worker /state: {} ; the host lost {lost_mb} MiB",
        log.replace('\n', " ")
    );
    assert!(log.contains("errno 28 ENOSPC"), "{log}");
    assert!(number(&log, "written_mb ") <= DISK_MB, "{log}");
    assert!(lost_mb < DISK_MB + SLACK_MB, "the host lost {lost_mb} MiB");
    let on_host: Vec<_> = std::fs::read_dir(host_state("state"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(on_host.is_empty(), "/state reached the host: {on_host:?}");
    worker_ok(
        &stack,
        "stop",
        json!({"vm_id": "state", "timeout_ms": 2000}),
    )
    .await;
    let check = json!({"vm_id": "state", "command": ["/bin/sh", "-c", "cat /state/kept; echo; echo checked; sleep 600"]});
    worker_ok(&stack, "start", check).await;
    let log = wait_log(&stack, "state", "checked", 1, Duration::from_secs(60)).await;
    assert!(log.contains("kept\nchecked"), "/state persisted: {log}");
    worker_ok(
        &stack,
        "stop",
        json!({"vm_id": "state", "timeout_ms": 2000}),
    )
    .await;

    // A worker whose host /state already held files (an earlier version's) keeps them: its
    // data is neither moved nor dropped, and the log says that /state is not bounded.
    let vm = json!({"vm_id": "legacy", "image": "python", "host_path": project.path()});
    worker_ok(&stack, "prepare", vm).await;
    std::fs::create_dir_all(host_state("legacy")).expect("legacy /state");
    std::fs::write(host_state("legacy").join("old.txt"), "old").expect("legacy file");
    let check = json!({"vm_id": "legacy", "command": ["/bin/sh", "-c", "cat /state/old.txt; echo; echo checked; sleep 600"]});
    worker_ok(&stack, "start", check).await;
    let log = wait_log(&stack, "legacy", "checked", 1, Duration::from_secs(60)).await;
    assert!(
        log.contains("old\nchecked"),
        "the earlier /state is kept: {log}"
    );
    assert!(
        stack.adapter.log().contains("NOT size-limited"),
        "the log says the earlier /state is not bounded"
    );
    worker_ok(
        &stack,
        "stop",
        json!({"vm_id": "legacy", "timeout_ms": 2000}),
    )
    .await;
}

/// An ordinary-user adapter's worker layer is served by FUSE daemons (`fuse_disk.rs`): one
/// killed outright (SIGKILL, no unmount, the image left marked not clean) costs the worker
/// nothing it had synced; its next start checks and repairs the image first.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_whose_disk_daemon_was_killed_outright_starts_again_with_its_files() {
    let test = "a_worker_whose_disk_daemon_was_killed_outright_starts_again_with_its_files";
    let Some(WorkerDisk {
        project,
        stack,
        how,
        _alone,
    }) = bounded_worker_disk(test, "worker_layers").await
    else {
        return;
    };
    if !how.contains("fuse2fs") {
        println!(
            "\n*** {test} DID NOT RUN: worker layers are not served by FUSE here ({how}) ***\n"
        );
        return;
    }
    let vm = json!({"vm_id": "fuse", "image": "python", "host_path": project.path()});
    worker_ok(&stack, "prepare", vm).await;
    let script = "import os\nfor path in ('/opt-kept', '/state/kept'):\n    with open(path, 'w') as f:\n        f.write('kept')\n        f.flush()\n        os.fsync(f.fileno())\nprint('synced', flush=True)\nimport time\ntime.sleep(600)\n";
    let start = json!({"vm_id": "fuse", "command": ["python3", "-c", script]});
    worker_ok(&stack, "start", start).await;
    wait_log(&stack, "fuse", "synced", 1, Duration::from_secs(60)).await;
    let image = stack.state_dir.path().join("workers/fuse/layer/disk.img");
    let daemon = jailed_fuse2fs(&image).expect("a fuse2fs serving the worker's image");
    assert_jailed(daemon);
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &daemon.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success(), "kill -9 {daemon}");
    worker_ok(&stack, "stop", json!({"vm_id": "fuse", "timeout_ms": 2000})).await;
    let check = json!({"vm_id": "fuse", "command": ["/bin/sh", "-c", "cat /opt-kept /state/kept; echo; echo checked; sleep 600"]});
    worker_ok(&stack, "start", check).await;
    let log = wait_log(&stack, "fuse", "checked", 1, Duration::from_secs(60)).await;
    assert!(
        log.contains("keptkept\nchecked"),
        "the layer survived: {log}"
    );
    let sandbox_log =
        std::fs::read_to_string(image.with_file_name("sandbox.log")).unwrap_or_default();
    assert!(
        sandbox_log.contains("e2fsck repaired it"),
        "the start checked the image: {sandbox_log}"
    );
    worker_ok(&stack, "stop", json!({"vm_id": "fuse", "timeout_ms": 2000})).await;
}

/// The `fuse2fs` whose jail holds `image` as its `/disk.img` (found through its root, as
/// the test's root may look).
fn jailed_fuse2fs(image: &std::path::Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(image).ok()?;
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let program = cmdline.split(|b| *b == 0).next()?;
        if !program.ends_with(b"fuse2fs") {
            return None;
        }
        let seen = std::fs::metadata(format!("/proc/{pid}/root/disk.img")).ok()?;
        (seen.dev() == want.dev() && seen.ino() == want.ino()).then_some(pid)
    })
}

/// What a guest that took over the daemon would hold: no capability, the sandbox's seccomp
/// filters, a pid and a network namespace of its own, and a root that shows none of the
/// host's files.
fn assert_jailed(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(field("Seccomp:"), "2", "the sandbox's filters: {status}");
    assert!(
        field("NSpid:").split_whitespace().count() >= 2,
        "its own pid namespace: {status}"
    );
    let ns = |who: &str| std::fs::read_link(format!("/proc/{who}/ns/net")).expect("net ns");
    assert_ne!(
        ns(&pid.to_string()),
        ns("self"),
        "its own network namespace"
    );
    let root = format!("/proc/{pid}/root");
    for host_file in ["etc/passwd", "home", "root", "tmp", "var"] {
        assert!(
            !std::path::Path::new(&root).join(host_file).exists(),
            "the jail shows the host's /{host_file}"
        );
    }
    let mut top: Vec<_> = std::fs::read_dir(&root)
        .expect("the jail's root")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    top.sort();
    println!("fuse2fs {pid}: jail root {top:?}");
    assert!(
        top.iter().all(|name| [
            "bin", "dev", "disk.img", "etc", "lib", "lib32", "lib64", "libx32", "mnt", "proc",
            "sbin", "usr"
        ]
        .contains(&name.as_str())),
        "the jail holds only the system's programs and its image: {top:?}"
    );
}
