//! Pulls through Debian's docker-registry with the fixture images of tests/fixtures/:
//! by tag and digest, multi-arch, zstd, Docker media types, whiteouts, Basic auth, and the
//! `python` preset through a docker.io mirror. Skipped loudly without docker-registry.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use common::real_registry::{self, RealRegistry};
use common::{assert_cache_consistent, settings};
use image_store::{ImageSettings, ImageStore, NoProgress};

const FIXTURES: &[&str] = &[
    "busybox",
    "multiarch",
    "whiteout",
    "zstd",
    "docker",
    "dockerlist",
    "python",
];
const CUSTOM: &[(&str, &str)] = &[
    ("busybox", "fixtures/busybox:latest"),
    ("multiarch", "fixtures/multiarch:latest"),
    ("whiteout", "fixtures/whiteout:latest"),
    ("zstd", "fixtures/zstd:latest"),
    ("docker", "fixtures/docker:latest"),
    ("dockerlist", "fixtures/dockerlist:latest"),
];

/// One registry per test binary, with every fixture pushed once.
fn registry() -> &'static RealRegistry {
    static REG: OnceLock<RealRegistry> = OnceLock::new();
    REG.get_or_init(|| {
        let reg = real_registry::start(None);
        real_registry::push(&reg.addr, FIXTURES, None);
        reg
    })
}

fn store(cache: &Path) -> ImageStore {
    ImageStore::new(settings(cache, &registry().addr, CUSTOM)).unwrap()
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn read(root: &Path, p: &str) -> String {
    std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[tokio::test]
async fn pull_by_tag_then_by_digest_gives_the_same_root() {
    if !real_registry::available("pull_by_tag_then_by_digest") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let s = store(cache.path());
    let p = s.ensure("busybox").await.expect("pull by tag");
    assert!(p.rootfs.join("bin/busybox").is_file());
    assert_eq!(read(&p.rootfs, "etc/motd"), "hello from busybox\n");
    assert!(p.config.env.iter().any(|e| e.starts_with("PATH=")));
    assert_eq!(p.config.cmd, vec!["/bin/sh"]);
    let digest = real_registry::fixture_digest("busybox");
    assert_eq!(p.manifest_digest, digest);
    let by_digest = format!("{}/fixtures/busybox@{digest}", registry().addr);
    let q = s
        .pull_reference(&by_digest, &NoProgress)
        .await
        .expect("pull by digest");
    assert_eq!(q.rootfs, p.rootfs);
    // Hard links of the layer survive unpacking.
    use std::os::unix::fs::MetadataExt;
    let ino = |f: &str| std::fs::metadata(p.rootfs.join(f)).unwrap().ino();
    assert_eq!(ino("opt/a"), ino("opt/a-link"));
    assert_cache_consistent(cache.path());
}

#[tokio::test]
async fn multiarch_index_selects_this_host_and_skips_attestations() {
    if !real_registry::available("multiarch") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let p = store(cache.path())
        .ensure("multiarch")
        .await
        .expect("multiarch pull");
    assert_eq!(
        read(&p.rootfs, "etc/arch"),
        format!("linux/{}\n", host_arch())
    );
    assert_ne!(
        p.manifest_digest,
        real_registry::fixture_digest("multiarch"),
        "root is per platform manifest"
    );
}

#[tokio::test]
async fn zstd_and_docker_media_types_unpack() {
    if !real_registry::available("zstd_and_docker") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let s = store(cache.path());
    for name in ["zstd", "docker", "dockerlist"] {
        let p = s
            .ensure(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            read(&p.rootfs, "etc/motd"),
            "hello from busybox\n",
            "{name}"
        );
        assert_eq!(
            read(&p.rootfs, "etc/arch"),
            format!("linux/{}\n", host_arch()),
            "{name}"
        );
    }
}

#[tokio::test]
async fn whiteouts_and_opaque_dirs_are_applied() {
    if !real_registry::available("whiteouts") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let p = store(cache.path())
        .ensure("whiteout")
        .await
        .expect("whiteout pull");
    assert!(
        !p.rootfs.join("etc/motd").exists(),
        "whiteout did not delete /etc/motd"
    );
    assert!(p.rootfs.join("etc/passwd").exists());
    assert!(
        !p.rootfs.join("opt/a").exists() && !p.rootfs.join("opt/a-link").exists(),
        "opaque /opt kept lower files"
    );
    assert_eq!(read(&p.rootfs, "opt/b"), "b\n");
    assert!(!p.rootfs.join("etc/.wh.motd").exists());
}

#[tokio::test]
async fn python_preset_through_a_docker_io_mirror_runs() {
    if !real_registry::available("python_preset") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let s = store(cache.path());
    assert!(!s.catalog()[0].installed);
    let p = s.ensure("python").await.expect("python via mirror");
    assert_eq!(p.oci_ref, "docker.io/library/python:3.12-slim");
    assert!(p.rootfs.join("usr/bin/python3").exists());
    let cat = s.catalog();
    assert_eq!((cat[0].name.as_str(), cat[0].installed), ("python", true));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let out = Command::new("chroot")
            .arg(&p.rootfs)
            .args(["/usr/bin/python3", "-c", "print(6*7)"])
            .output()
            .expect("chroot");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "42\n",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        println!("NOTE: not root, python not run inside the unpacked root");
    }
}

#[tokio::test]
async fn allowlist_and_auto_install_give_s100_and_s101() {
    if !real_registry::available("allowlist") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let mut closed = settings(cache.path(), &registry().addr, CUSTOM);
    closed.image_allowlist.clear();
    let s = ImageStore::new(closed.clone()).unwrap();
    assert_eq!(s.ensure("python").await.unwrap_err().code(), "S100");
    assert_eq!(s.ensure("nope").await.unwrap_err().code(), "S100");
    assert!(s.catalog().iter().all(|e| !e.allowed));

    let manual = ImageSettings {
        auto_install: false,
        ..settings(cache.path(), &registry().addr, CUSTOM)
    };
    let s = ImageStore::new(manual.clone()).unwrap();
    let err = s.ensure("busybox").await.unwrap_err();
    assert_eq!((err.code(), err.retryable()), ("S101", false));
    // Pre-pulled by another store sharing the cache: now installed without a pull.
    store(cache.path()).ensure("busybox").await.unwrap();
    let s = ImageStore::new(manual).unwrap();
    assert!(s
        .catalog()
        .iter()
        .any(|e| e.name == "busybox" && e.installed));
    s.ensure("busybox")
        .await
        .expect("installed image with auto_install off");
}

#[tokio::test]
async fn basic_auth_registry_with_good_and_bad_credentials() {
    if !real_registry::available("basic_auth") {
        return;
    }
    let has_htpasswd = Command::new("sh")
        .args(["-c", "command -v htpasswd"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_htpasswd {
        println!("\n*** SKIPPED basic_auth: htpasswd (apache2-utils) not installed ***\n");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let htpasswd = dir.path().join("htpasswd");
    let out = Command::new("htpasswd")
        .args(["-Bbc"])
        .arg(&htpasswd)
        .args(["tester", "right-pw"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let reg = real_registry::start(Some(&htpasswd));
    real_registry::push(&reg.addr, &["busybox"], Some("tester:right-pw"));

    let with_creds = |user: &str, pw: &str, name: &str| {
        let cfg = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &cfg,
            serde_json::json!({"auths": {reg.addr.clone(): {"username": user, "password": pw}}})
                .to_string(),
        )
        .unwrap();
        let cache = dir.path().join(format!("cache-{name}"));
        let mut s = settings(&cache, &reg.addr, &[("busybox", "fixtures/busybox:latest")]);
        s.docker_config = Some(cfg);
        ImageStore::new(s).unwrap()
    };
    let good = with_creds("tester", "right-pw", "good")
        .ensure("busybox")
        .await
        .expect("good credentials");
    assert!(good.rootfs.join("bin/busybox").is_file());
    for (user, pw, name) in [("tester", "wrong-pw", "bad"), ("", "", "none")] {
        let err = with_creds(user, pw, name)
            .ensure("busybox")
            .await
            .expect_err("bad credentials must fail");
        assert_eq!(err.code(), "S102");
        let chain = format!("{err} {:?}", err);
        assert!(
            chain.contains("401") || chain.to_lowercase().contains("unauthorized"),
            "{chain}"
        );
        assert_cache_consistent(&dir.path().join(format!("cache-{name}")));
    }
}

/// One line per entry: path, type, mode, owner, size, link target, mtime.
fn describe_tree(root: &Path) -> Vec<String> {
    let out = Command::new("find")
        .arg(".")
        .args(["-printf", "%p %y %m %U %G %s %l %T@\\n"])
        .current_dir(root)
        .output()
        .expect("find");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        // The root directory's own mtime is ours (a layer's "./" entry is not applied).
        .filter(|l| !l.starts_with(". "))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// Our unpacked roots match `umoci unpack` of the same images entry for entry (type, mode,
/// owner, size, link target, mtime) and byte for byte.
#[tokio::test]
async fn unpacked_roots_match_umoci() {
    if !real_registry::available("unpacked_roots_match_umoci") {
        return;
    }
    let tools = Command::new("sh")
        .args(["-c", "command -v skopeo && command -v umoci"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !tools {
        println!("\n*** SKIPPED unpacked_roots_match_umoci: skopeo/umoci not installed ***\n");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let s = store(&work.path().join("cache"));
    for (name, repo) in [
        ("whiteout", "fixtures/whiteout:latest"),
        ("python", "fixtures/python:latest"),
    ] {
        let layout = work.path().join("layout");
        let ok = Command::new("skopeo")
            .args(["copy", "-q", "--src-tls-verify=false"])
            .arg(format!("docker://{}/{repo}", registry().addr))
            .arg(format!("oci:{}:{name}", layout.display()))
            .status()
            .unwrap()
            .success();
        assert!(ok, "skopeo copy {name}");
        let bundle = work.path().join(format!("bundle-{name}"));
        let ok = Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{name}", layout.display()))
            .arg(&bundle)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "umoci unpack {name}");
        let theirs = bundle.join("rootfs");
        let ours = if name == "python" {
            s.pull_reference(&format!("{}/{repo}", registry().addr), &NoProgress)
                .await
                .unwrap()
                .rootfs
        } else {
            s.ensure(name).await.unwrap().rootfs
        };
        assert_eq!(
            describe_tree(&ours),
            describe_tree(&theirs),
            "{name}: metadata differs"
        );
        let same = Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .arg(&ours)
            .arg(&theirs)
            .status()
            .unwrap();
        assert!(same.success(), "{name}: contents differ");
    }
}
