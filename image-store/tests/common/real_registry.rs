//! Debian's docker-registry, started by the tests through tests/fixtures/start-registry.sh,
//! with the fixture images pushed by tests/fixtures/build-fixtures.sh.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct RealRegistry {
    pub addr: String,
    pid: u32,
    _dir: tempfile::TempDir,
}

impl Drop for RealRegistry {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; pid is the registry this struct started.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
    }
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// True when the tools the real-registry tests need are installed; prints a loud line if not.
pub fn available(test: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", "command -v docker-registry && command -v curl"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!(
            "\n*** SKIPPED {test}: docker-registry not installed (run tests/fixtures/install.sh) ***\n"
        );
    }
    ok
}

/// Starts a registry (with Basic auth when `htpasswd` is given); stops with the test process.
pub fn start(htpasswd: Option<&Path>) -> RealRegistry {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new("bash");
    cmd.arg(fixtures_dir().join("start-registry.sh"))
        .arg(dir.path())
        .env("REGISTRY_PARENT_PID", std::process::id().to_string());
    if let Some(h) = htpasswd {
        cmd.env("REGISTRY_HTPASSWD", h);
    }
    let out = cmd.output().expect("run start-registry.sh");
    assert!(
        out.status.success(),
        "start-registry.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    let pid: u32 = parts.next().and_then(|p| p.parse().ok()).expect("pid");
    let addr = parts.next().expect("addr").to_string();
    RealRegistry {
        addr,
        pid,
        _dir: dir,
    }
}

/// Builds (cached) and pushes the named fixture images to `addr`.
pub fn push(addr: &str, names: &[&str], user: Option<&str>) {
    let mut cmd = Command::new("bash");
    cmd.arg(fixtures_dir().join("build-fixtures.sh"))
        .arg(addr)
        .args(names);
    if let Some(u) = user {
        cmd.env("FIXTURE_USER", u);
    }
    let out = cmd.output().expect("run build-fixtures.sh");
    assert!(
        out.status.success(),
        "build-fixtures.sh failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The digest of the top manifest/index of a built fixture (from its OCI layout).
pub fn fixture_digest(name: &str) -> String {
    let cache = std::env::var_os("FIXTURE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("sandbox-libkrun-fixtures"));
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cache.join(name).join("index.json")).expect("index.json"),
    )
    .expect("json");
    index["manifests"][0]["digest"]
        .as_str()
        .expect("digest")
        .to_string()
}
