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
