//! Upgrading from iii 0.25: a python root that 0.25 pulled into its cache
//! (`<image_cache_dir>/<slug>/`, the root itself with `.oci-config.json` inside) serves
//! `create` with no registry reachable and `auto_install` off, its saved config in force, and
//! is never written into; without `.oci-config.json` (an extraction 0.25 did not finish) it is
//! not used: the create pulls and fails with S102.
//!
//! The 0.25 root is made from the fixture python image: pulled with our own store
//! (`sandbox-libkrun-pull`, into a scratch cache) from the test registry, then laid out as
//! 0.25 lays it out.

mod sandbox_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e_tests::{
    adapter_user, bwrap_usable, host_dir, profile_dir, registry, AdapterOptions, Stack,
};
use sandbox_support::{create, expect_err, stdout_of, stop};
use serde_json::{json, Value};

const PYTHON: &str = "docker.io/library/python:3.12-slim";
/// 0.25's directory for the python preset, worked out by hand from its slug rule.
const SLUG: &str = "docker.io-library-python-3.12-slim-75b604835a32490a";

/// A `host:port` nothing listens on.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    addr
}

/// `GET http://<registry>/v2/<path>` with curl, as JSON.
fn registry_json(path: &str) -> Value {
    let out = Command::new("curl")
        .args(["-sSf", "-H"])
        .arg("Accept: application/vnd.oci.image.manifest.v1+json")
        .arg(format!("http://{}/v2/{path}", registry()))
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "GET {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON answer")
}

/// The fixture python image's config blob, as 0.25 saved it next to the layers it extracted.
fn config_blob() -> Value {
    let manifest = registry_json("library/python/manifests/3.12-slim");
    let digest = manifest["config"]["digest"]
        .as_str()
        .expect("config digest");
    registry_json(&format!("library/python/blobs/{digest}"))
}

/// Lays out under `cache` the root 0.25 would have left for the python preset; with
/// `finished`, its `.oci-config.json` (the image's config, `MARK=025` added to its Env).
fn arrange_025(cache: &Path, finished: bool) -> PathBuf {
    let scratch = tempfile::tempdir().expect("tempdir");
    let reg = registry();
    let out = Command::new(profile_dir().join("sandbox-libkrun-pull"))
        .arg(PYTHON)
        .arg("--cache-dir")
        .arg(scratch.path())
        .args(["--insecure", reg, "--mirror"])
        .arg(format!("docker.io={reg}"))
        .output()
        .expect("run sandbox-libkrun-pull (cargo build --workspace first)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sandbox-libkrun-pull: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pulled = stdout
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(2))
        .expect("REF DIGEST ROOTFS");
    let dir = cache.join(SLUG);
    let copied = Command::new("cp")
        .arg("-a")
        .arg(pulled)
        .arg(&dir)
        .status()
        .expect("cp");
    assert!(copied.success(), "cp -a {pulled}");
    if finished {
        let mut config = config_blob();
        config["config"]["Env"]
            .as_array_mut()
            .expect("Env")
            .push("MARK=025".into());
        std::fs::write(
            dir.join(".oci-config.json"),
            serde_json::to_vec(&config).expect("json"),
        )
        .expect("write .oci-config.json");
    }
    // 0.25 ran as the user the adapter runs as: the root is theirs.
    if let Some(user) = adapter_user() {
        let owned = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", user.uid, user.gid))
            .arg(&dir)
            .status()
            .expect("chown");
        assert!(owned.success());
    }
    dir
}

/// Every entry below `dir` with its type, mode, owner, size and mtime, sorted.
fn snapshot(dir: &Path) -> Vec<String> {
    let out = Command::new("find")
        .arg(dir)
        .args(["-printf", "%p %y %m %U %s %T@\n"])
        .output()
        .expect("find");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

/// The adapter's configuration: `cache` as the image cache, every registry on a closed port.
fn offline(cache: &Path, auto_install: bool) -> Value {
    let closed = closed_port();
    json!({
        "image_cache_dir": cache,
        "registry_mirrors": {"docker.io": closed},
        "insecure_registries": [closed],
        "auto_install": auto_install,
    })
}

async fn python_installed(stack: &Stack) -> bool {
    let catalog = stack
        .call("catalog::list", json!({}))
        .await
        .expect("catalog::list");
    catalog["images"]
        .as_array()
        .and_then(|images| images.iter().find(|i| i["name"] == "python"))
        .unwrap_or_else(|| panic!("python not in {catalog}"))["installed"]
        .as_bool()
        .expect("installed")
}

#[tokio::test]
async fn create_uses_the_root_iii_025_pulled_with_no_registry() {
    if !bwrap_usable("create_uses_the_root_iii_025_pulled_with_no_registry") {
        return;
    }
    let cache = host_dir();
    let dir = arrange_025(cache.path(), true);
    let before = snapshot(&dir);
    let stack = Stack::start(offline(cache.path(), false), AdapterOptions::default()).await;
    assert!(python_installed(&stack).await, "{}", stack.adapter.log());

    let id = create(&stack, "python", json!({})).await;
    let out = stdout_of(
        &stack,
        &id,
        "python3 -c 'import os; print(6*7, os.environ.get(\"MARK\"), os.getcwd())' \
         && echo written > /etc/from-the-sandbox",
    )
    .await;
    assert_eq!(out, "42 025 /root\n");
    stop(&stack, &id, true).await;
    let log = stack.adapter.log();
    assert!(log.contains("using the root iii 0.25 pulled"), "{log}");

    // Nothing pulled, nothing written into 0.25's root (the sandbox wrote into its own layer).
    let roots = std::fs::read_dir(cache.path().join("images/roots"))
        .map(|rd| rd.count())
        .unwrap_or(0);
    assert_eq!(roots, 0, "a root was pulled into our cache");
    assert!(!dir.join("etc/from-the-sandbox").exists());
    assert_eq!(snapshot(&dir), before, "0.25's root changed");
}

#[tokio::test]
async fn an_unfinished_025_root_is_not_used() {
    if !bwrap_usable("an_unfinished_025_root_is_not_used") {
        return;
    }
    let cache = host_dir();
    let dir = arrange_025(cache.path(), false);
    let before = snapshot(&dir);
    let stack = Stack::start(offline(cache.path(), true), AdapterOptions::default()).await;
    assert!(!python_installed(&stack).await);

    let (code, body) = expect_err(
        stack.call("create", json!({"image": "python"})).await,
        "create python over an unfinished 0.25 root, no registry",
    );
    assert_eq!(code, "S102", "{body}");
    assert!(body.to_string().contains(PYTHON), "{body}");
    let log = stack.adapter.log();
    assert!(log.contains("not using iii 0.25's cached root"), "{log}");
    assert!(log.contains("did not finish"), "{log}");
    assert_eq!(snapshot(&dir), before, "0.25's root changed");
}
