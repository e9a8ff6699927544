//! Parallel first-time requests for one image download each blob once, within one process
//! (shared gate) and across two stores sharing a cache (file lock, as two processes would).

mod common;

use common::fake_registry::FakeRegistry;
use common::oci::good_image;
use common::{assert_cache_consistent, settings};
use image_store::ImageStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_parallel_ensures_download_each_blob_once() {
    let reg = FakeRegistry::start().await;
    let img = good_image("c");
    reg.put("c/img", "1", &img);
    // Slow layers, so every caller arrives while the first download is still running.
    reg.set_fault(common::fake_registry::Fault::Delay(200));
    let cache = tempfile::tempdir().unwrap();
    let s = settings(cache.path(), &reg.addr, &[("img", "c/img:1")]);
    let a = ImageStore::new(s.clone()).unwrap();
    let b = ImageStore::new(s).unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { store.ensure("img").await })
        })
        .collect();
    let mut roots = Vec::new();
    for t in tasks {
        roots.push(t.await.unwrap().expect("ensure").rootfs);
    }
    roots.dedup();
    assert_eq!(roots.len(), 1, "all callers get the same root");
    for digest in img.blobs.keys() {
        assert_eq!(reg.gets(digest), 1, "blob {digest} fetched more than once");
    }
    assert_cache_consistent(cache.path());
}

#[test]
fn store_and_its_futures_are_send_and_sync() {
    fn is_send_sync<T: Send + Sync + Clone>() {}
    fn is_send<T: Send>(_: &T) {}
    is_send_sync::<ImageStore>();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::new(settings(dir.path(), "127.0.0.1:1", &[])).unwrap();
    let fut = store.ensure("python");
    is_send(&fut);
}

/// Three `sandbox-libkrun-pull` processes sharing one cache pull each blob once: the file
/// lock, not the in-process gate, is what serialises them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_pull() {
    let reg = FakeRegistry::start().await;
    let img = good_image("procs");
    reg.put("p/img", "1", &img);
    // Slow layers, so the processes overlap.
    reg.set_fault(common::fake_registry::Fault::Delay(300));
    let cache = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_sandbox-libkrun-pull"))
                .arg(format!("{}/p/img:1", reg.addr))
                .arg("--cache-dir")
                .arg(cache.path())
                .arg("--insecure")
                .arg(&reg.addr)
                .output()
        })
        .collect();
    let mut roots = Vec::new();
    for out in futures::future::join_all(children).await {
        let out = out.expect("run sandbox-libkrun-pull");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        roots.push(line.split(' ').nth(2).expect("rootfs column").to_string());
    }
    roots.dedup();
    assert_eq!(roots.len(), 1, "all processes report the same root");
    for digest in img.blobs.keys() {
        assert_eq!(
            reg.gets(digest),
            1,
            "blob {digest} fetched by more than one process"
        );
    }
    assert_cache_consistent(cache.path());
}
