//! Fault injection against an in-process registry: every fault gives S102 (or a clear
//! refusal), leaves the cache consistent, and a later good pull succeeds.

mod common;

use common::fake_registry::{FakeRegistry, Fault};
use common::oci::{good_image, image, Tar};
use common::{assert_cache_consistent, list, settings};
use image_store::{ImageError, ImageStore};

async fn setup(repo: &str) -> (FakeRegistry, tempfile::TempDir, ImageStore) {
    let reg = FakeRegistry::start().await;
    let cache = tempfile::tempdir().unwrap();
    let store = ImageStore::new(settings(
        cache.path(),
        &reg.addr,
        &[("img", &format!("{repo}:1"))],
    ))
    .unwrap();
    (reg, cache, store)
}

fn expect_s102(
    res: Result<image_store::PreparedImage, ImageError>,
    want_in_message: &str,
) -> String {
    let err = res.expect_err("pull should fail");
    assert_eq!(err.code(), "S102", "{err}");
    assert!(err.retryable());
    let msg = with_cause(&err);
    assert!(
        msg.contains("t/img:1"),
        "message names the reference: {msg}"
    );
    assert!(
        msg.to_lowercase().contains(want_in_message),
        "message {msg:?} lacks {want_in_message:?}"
    );
    msg
}

/// The error and its cause, as one line to search.
fn with_cause(err: &ImageError) -> String {
    format!(
        "{err} / {:?}",
        std::error::Error::source(err).map(|s| s.to_string())
    )
}

/// Whether catalog entry `img` counts as installed.
fn img_installed(store: &ImageStore) -> bool {
    store
        .catalog()
        .iter()
        .any(|e| e.name == "img" && e.installed)
}

/// A pull of `img` that must now succeed with `marker` in its root, leaving the cache
/// consistent.
async fn pulls_with_marker(
    store: &ImageStore,
    cache: &std::path::Path,
    marker: &[u8],
    what: &str,
) -> image_store::PreparedImage {
    let p = store.ensure("img").await.expect(what);
    assert_eq!(std::fs::read(p.rootfs.join("etc/marker")).unwrap(), marker);
    assert_cache_consistent(cache);
    p
}

async fn transport_fault(fault: Fault, want: &str) {
    let (reg, cache, store) = setup("t/img").await;
    let img = good_image("v1");
    reg.put("t/img", "1", &img);
    reg.set_fault(fault);
    expect_s102(store.ensure("img").await, want);
    assert_cache_consistent(cache.path());
    let blobs = list(&cache.path().join("images/blobs/sha256"));
    for layer in &img.layer_digests {
        assert!(
            !blobs.contains(&layer[7..].to_string()),
            "bad layer kept in the cache"
        );
    }
    assert!(!img_installed(&store));
    reg.set_fault(Fault::None);
    pulls_with_marker(&store, cache.path(), b"v1", "good pull after the fault").await;
}

#[tokio::test]
async fn wrong_digest_is_s102() {
    transport_fault(Fault::WrongDigest, "digest").await;
}

#[tokio::test]
async fn truncated_layer_is_s102() {
    transport_fault(Fault::Truncated, "expected").await;
}

#[tokio::test]
async fn error_500_mid_pull_is_s102() {
    transport_fault(Fault::Error500, "500").await;
}

#[tokio::test]
async fn connection_dropped_mid_blob_is_s102() {
    transport_fault(Fault::AbortMidStream, "t/img:1").await;
}

/// A content fault: the image itself is bad. After it, a good image under the same tag pulls.
async fn content_fault(bad: common::oci::Image, want: &str) -> tempfile::TempDir {
    let (reg, cache, store) = setup("t/img").await;
    reg.put("t/img", "1", &bad);
    expect_s102(store.ensure("img").await, want);
    assert_cache_consistent(cache.path());
    reg.put("t/img", "1", &good_image("v2"));
    pulls_with_marker(&store, cache.path(), b"v2", "good pull after the bad image").await;
    cache
}

#[tokio::test]
async fn diff_id_mismatch_is_s102() {
    let layer = Tar::default().file("a", b"a").finish();
    let bad = image(&[layer], Some(vec![common::oci::sha(b"not the layer")]));
    content_fault(bad, "diff_id").await;
}

#[tokio::test]
async fn dotdot_entry_is_refused() {
    let bad = image(&[Tar::default().file("../../escaped", b"x").finish()], None);
    let cache = content_fault(bad, "..").await;
    assert!(!cache.path().join("images/escaped").exists());
    assert!(!cache.path().join("escaped").exists());
}

#[tokio::test]
async fn hardlink_out_of_root_is_refused() {
    let bad = image(
        &[Tar::default()
            .hardlink("etc/passwd-copy", "../../../../etc/passwd")
            .finish()],
        None,
    );
    content_fault(bad, "..").await;
}

/// A symlink pointing outside and a file written through it: the write lands inside the
/// root (the symlink is resolved as in a chroot), never outside.
#[tokio::test]
async fn symlink_escape_stays_inside_root() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().to_str().unwrap().to_string();
    let reg = FakeRegistry::start().await;
    let cache = tempfile::tempdir().unwrap();
    let store = ImageStore::new(settings(cache.path(), &reg.addr, &[("img", "t/img:1")])).unwrap();
    let evil = image(
        &[
            Tar::default()
                .symlink("escape", &target)
                .symlink("up", "../../../../..")
                .finish(),
            Tar::default()
                .file("escape/pwned", b"x")
                .file(&format!("up{target}/pwned2"), b"y")
                .finish(),
        ],
        None,
    );
    reg.put("t/img", "1", &evil);
    let p = store
        .ensure("img")
        .await
        .expect("contained symlinks are legitimate");
    assert!(
        list(outside.path()).is_empty(),
        "something was written outside the root"
    );
    let inside = p.rootfs.join(target.trim_start_matches('/'));
    assert!(inside.join("pwned").is_file() && inside.join("pwned2").is_file());
    assert_cache_consistent(cache.path());
}

/// A pull cancelled mid-download (the caller went away) leaves nothing a later create would
/// trust, and the next pull succeeds.
#[tokio::test]
async fn cancelled_pull_leaves_nothing_trusted() {
    let (reg, cache, store) = setup("t/img").await;
    reg.put("t/img", "1", &good_image("v1"));
    reg.set_fault(Fault::Stall);
    let s = store.clone();
    let task = tokio::spawn(async move { s.ensure("img").await });
    // Wait until a layer download has started, then cancel.
    for _ in 0..200 {
        if !list(&cache.path().join("images/blobs/tmp")).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    task.abort();
    let _ = task.await;
    assert_cache_consistent(cache.path());
    assert!(!img_installed(&store));
    reg.set_fault(Fault::None);
    pulls_with_marker(&store, cache.path(), b"v1", "pull after the cancelled one").await;
}

/// The Docker token flow (401 + Bearer challenge, token from Basic credentials): good
/// credentials from the Docker config pull; bad or missing ones are S102 naming the 401.
#[tokio::test]
async fn bearer_token_challenge_with_good_and_bad_credentials() {
    let reg = FakeRegistry::start().await;
    reg.put("t/img", "1", &good_image("tok"));
    reg.require_bearer("robot", "token-pw");
    let dir = tempfile::tempdir().unwrap();
    let store_with = |user: &str, pw: &str, tag: &str| {
        let cfg = dir.path().join(format!("{tag}.json"));
        std::fs::write(
            &cfg,
            serde_json::json!({"auths": {reg.addr.clone(): {"username": user, "password": pw}}})
                .to_string(),
        )
        .unwrap();
        let mut s = settings(&dir.path().join(tag), &reg.addr, &[("img", "t/img:1")]);
        s.docker_config = Some(cfg);
        ImageStore::new(s).unwrap()
    };
    let p = store_with("robot", "token-pw", "good")
        .ensure("img")
        .await
        .expect("token flow");
    assert_eq!(std::fs::read(p.rootfs.join("etc/marker")).unwrap(), b"tok");
    for (user, pw, tag) in [("robot", "nope", "bad"), ("", "", "anon")] {
        let err = store_with(user, pw, tag)
            .ensure("img")
            .await
            .expect_err("must be refused");
        assert_eq!(err.code(), "S102");
        let text = format!("{err} {err:?}");
        assert!(
            text.contains("401") || text.to_lowercase().contains("unauthorized"),
            "{text}"
        );
    }
}

/// An image over the size limit (a decompression bomb: 32 MiB of zeros, ~32 KiB gzipped) is
/// S102, not retryable, names the limit and its key, installs nothing; an image whose layers
/// alone weigh more than the limit is refused before any download. The same image pulls
/// under the default limit.
#[tokio::test]
async fn an_image_over_the_size_limit_is_refused() {
    let reg = FakeRegistry::start().await;
    let cache = tempfile::tempdir().unwrap();
    let bomb = image(
        &[
            Tar::default().file("etc/marker", b"bomb").finish(),
            Tar::default().file("zeros", &vec![0u8; 32 << 20]).finish(),
        ],
        None,
    );
    reg.put("t/img", "1", &bomb);
    let limited = |bytes: u64| {
        let mut s = settings(cache.path(), &reg.addr, &[("img", "t/img:1")]);
        s.limit.bytes = bytes;
        ImageStore::new(s).unwrap()
    };

    for (limit, want) in [(4 << 20, "uncompressed bytes"), (1024, "compressed")] {
        let err = limited(limit)
            .ensure("img")
            .await
            .expect_err("over the limit");
        let msg = with_cause(&err);
        assert_eq!(err.code(), "S102", "{msg}");
        assert!(!err.retryable(), "pulling again cannot help: {msg}");
        assert!(
            msg.contains(want) && msg.contains("max_image_size_mb"),
            "{msg}"
        );
        assert_cache_consistent(cache.path());
        assert!(!img_installed(&limited(limit)));
    }

    let store = limited(image_store::unpack::Budget::default().bytes);
    let p = pulls_with_marker(&store, cache.path(), b"bomb", "the default limit takes it").await;
    assert_eq!(
        std::fs::metadata(p.rootfs.join("zeros")).unwrap().len(),
        32 << 20
    );
}
