//! Snapshots and fork end to end on the bwrap backend, and on the libkrun plugin's microVMs
//! where `SANDBOX_E2E_PLUGIN=libkrun` (the VM lab runs them so): a sandbox's files (contents, owners,
//! modes, a symlink, a deleted image file, a directory that hides the image's) kept by
//! `snapshot::create` while it keeps running; sandboxes started from the snapshot each see
//! exactly that state and never each other's writes; the snapshot outlives its source, its own
//! deletion (for the sandboxes already started) and an adapter restart; the disk budget holds;
//! `fork` starts N copies all or nothing.

mod sandbox_support;

use e2e_tests::{bwrap_usable, AdapterOptions, Stack};
use sandbox_support::{create, expect_err, live_ids, stdout_of, stop};
use serde_json::{json, Value};

/// What the source sandbox installs (the image's tools are busybox's): 3 MiB of random bytes
/// with their sum and a hard link, a file of another owner (where the sandbox has ids beside
/// its root) and mode, a symlink, the image's `/etc/motd` deleted, and the image's `/opt`
/// replaced by a directory of the sandbox's own (see [`REPLACE_OPT`]).
const INSTALL: &str = "set -e; mkdir -p /opt/app; cd /opt/app; \
    busybox head -c 3145728 /dev/urandom > blob; busybox sha256sum blob > blob.sum; \
    ln blob blob-link; echo secret > owned; busybox chmod 640 owned; \
    if [ \"$OTHER_IDS\" = 1 ]; then busybox chown 1000:1001 owned; fi; \
    ln -s /opt/app/owned link; test -f /etc/motd; rm /etc/motd";

/// What a sandbox from the snapshot must show of it (one line each).
const CHECK: &str = "cd /opt/app && busybox sha256sum -c blob.sum >/dev/null && echo sum-ok; \
    stat -c '%h' blob-link; stat -c '%u:%g %a' owned; busybox readlink link; cat link; \
    if [ -e /etc/motd ]; then echo motd-back; else echo motd-gone; fi; ls /opt; \
    if [ -e /opt/app/after ]; then echo after-seen; else echo after-absent; fi";

fn libkrun_under_test() -> bool {
    std::env::var("SANDBOX_E2E_PLUGIN").is_ok_and(|p| p == "libkrun")
}

/// The adapter of the plugin under test: bwrap, or libkrun (under its own adapter name).
fn options() -> AdapterOptions {
    let mut options = AdapterOptions::default();
    if libkrun_under_test() {
        options.plugin = e2e_tests::PluginKind::Libkrun;
        options.prefix = None;
    }
    options
}

/// Whether `test` can run here: bwrap where it is usable (else it says it did not run); the
/// libkrun plugin must boot where it is the plugin under test, never skip.
fn usable(test: &str) -> bool {
    libkrun_under_test() || bwrap_usable(test)
}

/// The stack of a test, on the plugin under test, with `config`.
async fn start(config: Value) -> Stack {
    let stack = Stack::start(config, options()).await;
    if libkrun_under_test() {
        let info = stack.call("adapter::info", json!({})).await.expect("info");
        assert_eq!(
            info["backend"]["ready"], true,
            "libkrun must boot here: {info}"
        );
    }
    stack
}

async fn other_ids(stack: &Stack) -> bool {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    info["backend"]["isolation"]["ids_in_sandbox"]
        .as_u64()
        .is_some_and(|n| n > 1)
}

/// The image's `/opt` (holding `a`) removed whole: overlayfs then marks the sandbox's new
/// `/opt` opaque with an xattr. Every sandbox's overlay is mounted from a user namespace (the
/// bwrap launcher's; the VM runner's, which gives host root up first), so the mark is kept in
/// `user.*`, which tmpfs, the sandbox's writable layer, stores only from Linux 6.6: before,
/// removing a non-empty image directory fails with EIO, once its files are gone (whiteouts
/// need no xattr). Then `/opt` stays, empty, not opaque, and the test says the check of an
/// opaque directory did not run; anything else fails.
const REPLACE_OPT: &str = "test -f /opt/a; if rm -rf /opt 2>/tmp/rm.err; then echo replaced; \
    elif grep -q 'Input/output error' /tmp/rm.err; then echo no-opaque-dirs; else cat /tmp/rm.err; fi";

/// Runs [`REPLACE_OPT`] in `id`; the image's `/opt/a` is gone either way, `/opt` itself
/// unless the kernel cannot mark directories opaque for this sandbox (see there).
async fn replace_opt(stack: &Stack, id: &str) {
    let out = stdout_of(stack, id, REPLACE_OPT).await;
    match out.as_str() {
        "replaced\n" => {}
        "no-opaque-dirs\n" if kernel_before_6_6() => {
            eprintln!(
                "DID NOT RUN: a snapshot of a directory that replaced the image's: this kernel's \
                 tmpfs keeps no user xattrs (before Linux 6.6), so this sandbox's overlay \
                 cannot remove a non-empty image directory (EIO)"
            );
        }
        other => panic!("removing the image's /opt: {other:?}"),
    }
}

fn kernel_before_6_6() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().ok());
    matches!((parts.next(), parts.next()), (Some(Some(major)), Some(Some(minor))) if (major, minor) < (6, 6))
}

fn expected(other_ids: bool) -> String {
    let owner = if other_ids { "1000:1001" } else { "0:0" };
    format!("sum-ok\n2\n{owner} 640\n/opt/app/owned\nsecret\nmotd-gone\napp\nafter-absent\n")
}

fn snapshot_layers(stack: &Stack) -> usize {
    std::fs::read_dir(stack.state_dir.path().join("snapshots/layers"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn listed(list: &Value) -> Vec<String> {
    list["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| s["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_keep_a_sandboxs_files_and_their_sandboxes_never_share_writes() {
    if !usable("snapshots_keep_a_sandboxs_files_and_their_sandboxes_never_share_writes") {
        return;
    }
    let mut stack = start(json!({"max_snapshot_disk_mb": 64})).await;
    let other = other_ids(&stack).await;
    let source = create(
        &stack,
        "python",
        json!({"env": {"OTHER_IDS": if other { "1" } else { "0" }}}),
    )
    .await;
    replace_opt(&stack, &source).await;
    let out = stdout_of(&stack, &source, &format!("{INSTALL}; echo installed")).await;
    assert_eq!(out, "installed\n", "{}", stack.adapter.log());

    let taken = stack
        .call(
            "snapshot::create",
            json!({"sandbox_id": source, "name": "prepared"}),
        )
        .await
        .unwrap_or_else(|e| panic!("snapshot: {e:?}\n{}", stack.adapter.log()));
    assert_eq!(taken["name"], "prepared");
    assert_eq!(taken["image"], "python");
    let size = taken["size_bytes"].as_u64().expect("size_bytes");
    assert!((3 << 20..16 << 20).contains(&size), "size_bytes {size}");
    assert!(
        taken["created_at"].as_str().unwrap().ends_with('Z'),
        "{taken}"
    );
    // The source keeps running and writing; the snapshot does not see it.
    let out = stdout_of(
        &stack,
        &source,
        "echo later > /opt/app/after && rm /opt/app/blob.sum && echo ok",
    )
    .await;
    assert_eq!(out, "ok\n");

    let copies = [
        create(&stack, "python", json!({"snapshot": "prepared"})).await,
        create(&stack, "python", json!({"snapshot": "prepared"})).await,
        create(&stack, "python", json!({"snapshot": "prepared"})).await,
    ];
    for (n, id) in copies.iter().enumerate() {
        assert_eq!(
            stdout_of(&stack, id, CHECK).await,
            expected(other),
            "copy {n}"
        );
        let out = stdout_of(
            &stack,
            id,
            &format!("echo {n} > /opt/app/mine-{n} && echo > /opt/app/owned && echo ok"),
        )
        .await;
        assert_eq!(out, "ok\n");
    }
    for (n, id) in copies.iter().enumerate() {
        let seen = stdout_of(
            &stack,
            id,
            "ls /opt/app | grep mine-; wc -c < /opt/app/owned",
        )
        .await;
        assert_eq!(
            seen,
            format!("mine-{n}\n1\n"),
            "copy {n} sees only its own writes"
        );
    }
    let seen = stdout_of(
        &stack,
        &source,
        "ls /opt/app | grep -c mine- ; cat /opt/app/owned",
    )
    .await;
    assert_eq!(
        seen, "0\nsecret\n",
        "the source sees none of the copies' writes"
    );

    // Refusals: a taken name, an unknown snapshot, another image's create, bad names.
    let (code, _) = expect_err(
        stack
            .call(
                "snapshot::create",
                json!({"sandbox_id": source, "name": "prepared"}),
            )
            .await,
        "same name",
    );
    assert_eq!(code, "S602");
    let (code, _) = expect_err(
        stack
            .call("create", json!({"image": "python", "snapshot": "nothing"}))
            .await,
        "unknown snapshot",
    );
    assert_eq!(code, "S601");
    let (code, _) = expect_err(
        stack
            .call(
                "create",
                json!({"image": "busybox", "snapshot": "prepared"}),
            )
            .await,
        "another image",
    );
    assert_eq!(code, "S603");
    for bad in ["", "../x", ".hidden", "a/b"] {
        let (code, _) = expect_err(
            stack
                .call(
                    "snapshot::create",
                    json!({"sandbox_id": source, "name": bad}),
                )
                .await,
            "bad name",
        );
        assert_eq!(code, "S001", "{bad:?}");
    }

    let list = stack.call("snapshot::list", json!({})).await.expect("list");
    assert_eq!(listed(&list), ["prepared"]);
    assert!(list["used_bytes"].as_u64().unwrap() >= size, "{list}");
    assert_eq!(list["budget_bytes"], 64u64 << 20);

    // Deleting the snapshot leaves the sandboxes started from it intact.
    let deleted = stack
        .call("snapshot::delete", json!({"name": "prepared"}))
        .await
        .expect("delete");
    assert_eq!(deleted, json!({"deleted": true, "name": "prepared"}));
    let out = stdout_of(
        &stack,
        &copies[0],
        "cd /opt/app && busybox sha256sum -c blob.sum",
    )
    .await;
    assert!(out.contains("OK"), "{out}");
    let (code, _) = expect_err(
        stack
            .call("create", json!({"image": "python", "snapshot": "prepared"}))
            .await,
        "deleted snapshot",
    );
    assert_eq!(code, "S601");
    let (code, _) = expect_err(
        stack
            .call("snapshot::delete", json!({"name": "prepared"}))
            .await,
        "deleted again",
    );
    assert_eq!(code, "S601");

    // A snapshot of a sandbox from a snapshot stacks both; it outlives the adapter.
    let out = stdout_of(
        &stack,
        &copies[1],
        "echo second > /opt/app/second && echo ok",
    )
    .await;
    assert_eq!(out, "ok\n");
    stack
        .call(
            "snapshot::create",
            json!({"sandbox_id": copies[1], "name": "kept"}),
        )
        .await
        .expect("snapshot of a copy");
    stack.adapter.terminate();
    stack.restart_adapter(&options()).await;
    let list = stack.call("snapshot::list", json!({})).await.expect("list");
    assert_eq!(listed(&list), ["kept"], "the snapshot survives the restart");
    let again = create(&stack, "python", json!({"snapshot": "kept"})).await;
    let out = stdout_of(
        &stack,
        &again,
        "cat /opt/app/second /opt/app/mine-1; test -e /opt/app/mine-0 || echo no-0",
    )
    .await;
    assert_eq!(out, "second\n1\nno-0\n");
    stop(&stack, &again, true).await;
    stack
        .call("snapshot::delete", json!({"name": "kept"}))
        .await
        .expect("delete kept");
    assert_eq!(
        snapshot_layers(&stack),
        0,
        "no layer stays once nothing needs it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_snapshot_budget_holds_and_a_refused_capture_leaves_nothing() {
    if !usable("the_snapshot_budget_holds_and_a_refused_capture_leaves_nothing") {
        return;
    }
    let stack = start(json!({"max_snapshot_disk_mb": 8})).await;
    let id = create(&stack, "python", json!({})).await;
    let out = stdout_of(&stack, &id, "head -c 12582912 /dev/zero > /big && echo ok").await;
    assert_eq!(out, "ok\n");
    let (code, body) = expect_err(
        stack
            .call("snapshot::create", json!({"sandbox_id": id, "name": "big"}))
            .await,
        "over budget",
    );
    assert_eq!(code, "S400", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("max_snapshot_disk_mb"),
        "{body}"
    );
    assert_eq!(snapshot_layers(&stack), 0, "the refused copy is gone");
    let list = stack.call("snapshot::list", json!({})).await.expect("list");
    assert_eq!(list["used_bytes"], 0);
    // The sandbox was thawed and still serves; a smaller one fits.
    let out = stdout_of(
        &stack,
        &id,
        "rm /big && head -c 1048576 /dev/zero > /small && echo ok",
    )
    .await;
    assert_eq!(out, "ok\n");
    let small = stack
        .call(
            "snapshot::create",
            json!({"sandbox_id": id, "name": "small"}),
        )
        .await
        .expect("a snapshot within the budget");
    assert!(small["size_bytes"].as_u64().unwrap() >= 1 << 20);
    // About 1 MiB each: the eighth cannot fit in 8 MiB.
    let mut refused = None;
    for n in 2..=10 {
        match stack
            .call(
                "snapshot::create",
                json!({"sandbox_id": id, "name": format!("small{n}")}),
            )
            .await
        {
            Ok(_) => continue,
            Err(e) => {
                refused = Some(e2e_tests::s_code(&e));
                break;
            }
        }
    }
    let list = stack.call("snapshot::list", json!({})).await.expect("list");
    assert!(list["used_bytes"].as_u64().unwrap() <= 8 << 20, "{list}");
    let code = refused.expect("the budget fills up");
    assert_eq!(code, "S400");
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_starts_copies_that_see_the_sources_files_all_or_nothing() {
    if !usable("fork_starts_copies_that_see_the_sources_files_all_or_nothing") {
        return;
    }
    // Eight on bwrap; two microVMs in the VM lab, whose emulated machine has room for four
    // guests at a time. The cap leaves one slot beside the fork and its source.
    let count: usize = if libkrun_under_test() { 2 } else { 8 };
    let stack = start(json!({"max_concurrent_sandboxes": count + 2})).await;
    let source = create(&stack, "python", json!({"env": {"ROLE": "source"}})).await;
    let out = stdout_of(&stack, &source, "mkdir -p /work && cd /work && head -c 1048576 /dev/urandom > data && busybox sha256sum data > data.sum && echo ok").await;
    assert_eq!(out, "ok\n");
    let forked = stack
        .call("fork", json!({"sandbox_id": source, "count": count}))
        .await
        .unwrap_or_else(|e| panic!("fork: {e:?}\n{}", stack.adapter.log()));
    let ids: Vec<String> = forked["sandbox_ids"]
        .as_array()
        .expect("sandbox_ids")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), count);
    for (n, id) in ids.iter().enumerate() {
        let out = stdout_of(&stack, id, &format!("cd /work && busybox sha256sum -c data.sum >/dev/null && echo sum-ok; echo $ROLE; echo {n} > mine; ls")).await;
        assert_eq!(out, "sum-ok\nsource\ndata\ndata.sum\nmine\n", "fork {n}");
    }
    let out = stdout_of(&stack, &source, "ls /work").await;
    assert_eq!(
        out, "data\ndata.sum\n",
        "the source sees none of the forks' writes"
    );

    // One slot left: a fork of 2 is refused whole.
    let before = live_ids(&stack).await.len();
    let (code, _) = expect_err(
        stack
            .call("fork", json!({"sandbox_id": source, "count": 2}))
            .await,
        "fork past the cap",
    );
    assert_eq!(code, "S400");
    assert_eq!(
        live_ids(&stack).await.len(),
        before,
        "nothing of the refused fork started"
    );
    let (code, _) = expect_err(
        stack
            .call("fork", json!({"sandbox_id": source, "count": 0}))
            .await,
        "fork of none",
    );
    assert_eq!(code, "S001");

    for id in ids.iter().chain([&source]) {
        stop(&stack, id, true).await;
    }
    assert_eq!(
        snapshot_layers(&stack),
        0,
        "the fork's layer goes with its last sandbox"
    );
}

/// Every regular file's contents under `dir`, without following a link.
fn contents_under(dir: &std::path::Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            all.push_str(&contents_under(&entry.path()));
        } else if kind.is_file() {
            all.push_str(&String::from_utf8_lossy(
                &std::fs::read(entry.path()).unwrap_or_default(),
            ));
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guests_links_fifos_and_sparse_files_never_lead_the_copy_out_or_past_its_budget() {
    use std::os::unix::fs::FileTypeExt;
    let test = "a_guests_links_fifos_and_sparse_files_never_lead_the_copy_out_or_past_its_budget";
    if !usable(test) {
        return;
    }
    let host = e2e_tests::host_dir();
    let canary = sandbox_support::Canary::plant(host.path(), "secret");
    let target = canary.path.display().to_string();
    let stack = start(json!({"max_snapshot_disk_mb": 32})).await;
    let id = create(&stack, "python", json!({})).await;
    // Links a copy run on the host would follow to the host's file, a fifo that would hold a
    // reader, a link to the root.
    let plant = format!(
        "set -e; mkdir -p /opt/bait; cd /opt/bait; ln -s {target} to-host; \
         ln -s /proc/self/root{target} via-proc; ln -s / root-link; busybox mkfifo fifo; \
         mkdir -p {parent}; ln -s {target} {target}-link; echo planted",
        parent = host.path().display()
    );
    assert_eq!(stdout_of(&stack, &id, &plant).await, "planted\n");
    let taken = stack
        .call(
            "snapshot::create",
            json!({"sandbox_id": id, "name": "bait"}),
        )
        .await
        .unwrap_or_else(|e| panic!("snapshot: {e:?}\n{}", stack.adapter.log()));
    let layers = stack.state_dir.path().join("snapshots/layers");
    let layer = std::fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .find(|e| e.file_type().unwrap().is_dir())
        .expect("the snapshot's layer")
        .path();
    let bait = layer.join("opt/bait");
    assert_eq!(
        std::fs::read_link(bait.join("to-host"))
            .unwrap()
            .display()
            .to_string(),
        target
    );
    assert_eq!(
        std::fs::read_link(bait.join("root-link"))
            .unwrap()
            .display()
            .to_string(),
        "/"
    );
    assert!(std::fs::symlink_metadata(bait.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    canary.assert_untouched_when("after the copy");
    canary.assert_not_in(&contents_under(&layer), "the snapshot's files");
    canary.assert_not_in(&taken.to_string(), "the reply");
    // A sandbox from it has the links as links, pointing at nothing of the host.
    let copy = create(&stack, "python", json!({"snapshot": "bait"})).await;
    let out = stdout_of(
        &stack,
        &copy,
        "busybox readlink /opt/bait/to-host; cat /opt/bait/to-host 2>/dev/null || echo unreadable",
    )
    .await;
    assert_eq!(out, format!("{target}\nunreadable\n"));

    // 100 GiB of holes: the copy stops at the budget instead of writing them out.
    let out = stdout_of(
        &stack,
        &id,
        "busybox truncate -s 100G /opt/sparse && echo sparse",
    )
    .await;
    assert_eq!(out, "sparse\n");
    let (code, _) = expect_err(
        stack
            .call(
                "snapshot::create",
                json!({"sandbox_id": id, "name": "sparse"}),
            )
            .await,
        "a sparse file past the budget",
    );
    assert_eq!(code, "S400");
    let list = stack.call("snapshot::list", json!({})).await.expect("list");
    assert_eq!(listed(&list), ["bait"]);
    canary.assert_untouched();
}
