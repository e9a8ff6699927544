//! Upgrading from iii 0.25: a root 0.25 pulled into `<image_cache_dir>/<slug>/` is used as it
//! is, with no registry reachable and with `auto_install` off, and is never written into; an
//! unfinished one (no `.oci-config.json`) is not used; our own cache wins when it has the
//! reference.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fake_registry::FakeRegistry;
use common::oci::{image, Image, Tar};
use common::{list, settings};
use image_store::{ImageSource, ImageStore, NoProgress};

const PYTHON: &str = "docker.io/library/python:3.12-slim";
/// 0.25's directory for the python preset, worked out by hand from its rule.
const SLUG: &str = "docker.io-library-python-3.12-slim-75b604835a32490a";

/// A `host:port` nothing listens on.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    addr
}

fn python_image() -> Image {
    image(
        &[Tar::default()
            .dir("bin/")
            .file("bin/sh", b"#!/bin/true\n")
            .dir("etc/")
            .file("etc/marker", b"from 0.25\n")
            .finish()],
        None,
    )
}

/// The image's config blob, as 0.25 saved it, with `MARK=025` added to its Env.
fn saved_config(img: &Image) -> Vec<u8> {
    let (_, blob) = img
        .blobs
        .iter()
        .find(|(d, _)| !img.layer_digests.contains(d))
        .expect("config blob");
    let mut config: serde_json::Value = serde_json::from_slice(blob).unwrap();
    config["config"]["Env"]
        .as_array_mut()
        .unwrap()
        .push("MARK=025".into());
    serde_json::to_vec(&config).unwrap()
}

/// Pulls the image with our own store, then lays its root out as 0.25 did under `cache`.
async fn arrange_025(cache: &Path, with_config: bool) -> PathBuf {
    let reg = FakeRegistry::start().await;
    let img = python_image();
    reg.put("library/python", "3.12-slim", &img);
    let scratch = tempfile::tempdir().unwrap();
    let store = ImageStore::new(settings(scratch.path(), &reg.addr, &[])).unwrap();
    let pulled = store.ensure("python").await.expect("pull with our store");
    let dir = cache.join(SLUG);
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&pulled.rootfs)
        .arg(&dir)
        .status()
        .unwrap();
    assert!(copied.success());
    if with_config {
        std::fs::write(dir.join(".oci-config.json"), saved_config(&img)).unwrap();
    }
    dir
}

/// Every entry below `dir` with its type, mode, size and mtime, sorted.
fn snapshot(dir: &Path) -> Vec<String> {
    let out = Command::new("find")
        .arg(dir)
        .args(["-printf", "%p %y %m %s %T@\n"])
        .output()
        .unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

fn offline(cache: &Path, auto_install: bool) -> ImageStore {
    let mut s = settings(cache, &closed_port(), &[]);
    s.auto_install = auto_install;
    ImageStore::new(s).unwrap()
}

fn installed(store: &ImageStore, name: &str) -> bool {
    store
        .catalog()
        .iter()
        .any(|e| e.name == name && e.installed)
}

#[tokio::test]
async fn a_root_iii_025_pulled_is_used_with_no_registry_and_never_written() {
    let cache = tempfile::tempdir().unwrap();
    let dir = arrange_025(cache.path(), true).await;
    let before = snapshot(&dir);

    for auto_install in [false, true] {
        let store = offline(cache.path(), auto_install);
        assert!(installed(&store, "python"));
        assert!(!installed(&store, "node"));
        for _ in 0..2 {
            let p = store.ensure("python").await.expect("the 0.25 root");
            assert_eq!(p.source, ImageSource::Iii025Cache);
            assert_eq!(p.rootfs, dir);
            assert_eq!(p.oci_ref, PYTHON);
            assert_eq!(p.manifest_digest, "");
            assert_eq!(p.config.env, vec!["PATH=/bin", "MARK=025"]);
            assert_eq!(p.config.cmd, vec!["/bin/sh"]);
            assert_eq!(
                std::fs::read_to_string(p.rootfs.join("etc/marker")).unwrap(),
                "from 0.25\n"
            );
        }
    }
    // Nothing was pulled into our cache, nothing written into 0.25's root.
    assert!(list(&cache.path().join("images/roots")).is_empty());
    assert!(list(&cache.path().join("images/blobs/sha256")).is_empty());
    assert_eq!(snapshot(&dir), before);
}

#[tokio::test]
async fn an_unfinished_025_root_is_not_used() {
    let cache = tempfile::tempdir().unwrap();
    let dir = arrange_025(cache.path(), false).await;
    let before = snapshot(&dir);

    let store = offline(cache.path(), true);
    assert!(!installed(&store, "python"));
    let err = store.ensure("python").await.expect_err("pulls, and fails");
    assert_eq!(err.code(), "S102", "{err}");
    assert!(err.to_string().contains(PYTHON), "{err}");

    let store = offline(cache.path(), false);
    let err = store.ensure("python").await.expect_err("not installed");
    assert_eq!(err.code(), "S101", "{err}");
    assert_eq!(snapshot(&dir), before);
}

#[tokio::test]
async fn our_own_cache_wins_over_the_025_root() {
    let cache = tempfile::tempdir().unwrap();
    let dir = arrange_025(cache.path(), true).await;
    let reg = FakeRegistry::start().await;
    // A different image under the same tag, so the two roots can be told apart.
    let img = image(
        &[Tar::default()
            .dir("bin/")
            .dir("etc/")
            .file("etc/marker", b"pulled\n")
            .finish()],
        None,
    );
    reg.put("library/python", "3.12-slim", &img);
    let store = ImageStore::new(settings(cache.path(), &reg.addr, &[])).unwrap();
    let pulled = store
        .pull_reference(PYTHON, &NoProgress)
        .await
        .expect("explicit pull");
    assert_eq!(pulled.source, ImageSource::Pulled);
    let p = offline(cache.path(), false)
        .ensure("python")
        .await
        .expect("ours");
    assert_eq!(p.source, ImageSource::Pulled);
    assert_eq!(p.rootfs, pulled.rootfs);
    assert_ne!(p.rootfs, dir);
    assert_eq!(
        std::fs::read_to_string(p.rootfs.join("etc/marker")).unwrap(),
        "pulled\n"
    );
}
