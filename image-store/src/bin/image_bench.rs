//! image-bench: pull+unpack of the python fixture image, ours against `skopeo copy` +
//! `umoci unpack` from the same local registry in the same run; plus cached lookups.
//!
//! Run: `cargo run -p image-store --release --bin image-bench -- [--runs N] [--registry H:P]`.
//! Without `--registry` it starts Debian's docker-registry through tests/fixtures/ and pushes
//! the fixture (needs tests/fixtures/install.sh). Prints a table; asserts nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use image_store::{ImageSettings, ImageStore, NoProgress};

#[derive(Parser, Debug)]
struct Args {
    /// Timed runs per method (the median is shown).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Use this registry (host:port, plain http) instead of starting one.
    #[arg(long)]
    registry: Option<String>,
    /// Repository:tag of the image inside the registry.
    #[arg(long, default_value = "fixtures/python:latest")]
    image: String,
    /// Also write the rows, with every sample, as JSON here (the format sandbox-bench
    /// merges with `--merge`).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn samples_ms(v: &[Duration]) -> Vec<f64> {
    v.iter().map(|d| d.as_secs_f64() * 1000.0).collect()
}

/// The rows in sandbox-bench's report format.
fn json_rows(
    cold: &[Duration],
    theirs: &[Duration],
    fresh: &[Duration],
    have: bool,
) -> serde_json::Value {
    let pull = if have {
        serde_json::json!({
            "what": "pull + unpack, cold (python fixture)", "unit": "ms", "compare": "ratio",
            "samples": samples_ms(cold), "baseline": "skopeo copy + umoci unpack",
            "baseline_samples": samples_ms(theirs), "goal": "",
            "note": "image-bench, local registry; under 1x is faster",
        })
    } else {
        serde_json::json!({
            "what": "pull + unpack, cold (python fixture)", "unit": "ms", "compare": "none",
            "samples": samples_ms(cold), "baseline": "", "baseline_samples": [], "goal": "",
            "note": "no baseline: skopeo and umoci are not installed (tests/fixtures/install.sh)",
        })
    };
    let lookup = serde_json::json!({
        "what": "cached image lookup (new store)", "unit": "ms", "compare": "none",
        "samples": samples_ms(fresh), "baseline": "", "baseline_samples": [], "goal": "",
        "note": "image-bench: ensure of a cached image from a store just opened",
    });
    serde_json::json!({"rows": [pull, lookup]})
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

struct Registry {
    addr: String,
    pid: Option<u32>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            // SAFETY: kill has no memory preconditions; pid is the registry we started.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
}

fn start_registry() -> Result<Registry> {
    let dir = tempfile::tempdir()?;
    let out = Command::new("bash")
        .arg(fixtures().join("start-registry.sh"))
        .arg(dir.path())
        .env("REGISTRY_PARENT_PID", std::process::id().to_string())
        .output()
        .context("start-registry.sh")?;
    if !out.status.success() {
        bail!(
            "start-registry.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut it = text.split_whitespace();
    let pid = it.next().and_then(|p| p.parse().ok());
    let addr = it.next().context("registry address")?.to_string();
    let push = Command::new("bash")
        .arg(fixtures().join("build-fixtures.sh"))
        .arg(&addr)
        .arg("python")
        .stdout(Stdio::null())
        .status()?;
    if !push.success() {
        bail!("build-fixtures.sh failed");
    }
    Ok(Registry {
        addr,
        pid,
        _dir: Some(dir),
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn settings(cache: &Path, addr: &str, image: &str) -> ImageSettings {
    let mut s = ImageSettings::with_defaults();
    s.cache_dir = cache.to_path_buf();
    s.insecure_registries = vec![addr.to_string()];
    s.docker_config = None;
    s.custom_images
        .insert("bench".into(), format!("{addr}/{image}"));
    s.image_allowlist.push("bench".into());
    s
}

fn skopeo_umoci(addr: &str, image: &str, work: &Path) -> Result<Duration> {
    let layout = work.join("layout");
    let bundle = work.join("bundle");
    let t = Instant::now();
    let ok = Command::new("skopeo")
        .args(["copy", "-q", "--src-tls-verify=false"])
        .arg(format!("docker://{addr}/{image}"))
        .arg(format!("oci:{}:bench", layout.display()))
        .status()?
        .success()
        && Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:bench", layout.display()))
            .arg(&bundle)
            .stdout(Stdio::null())
            .status()?
            .success();
    if !ok {
        bail!("skopeo/umoci failed");
    }
    Ok(t.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let reg = match &args.registry {
        Some(a) => Registry {
            addr: a.clone(),
            pid: None,
            _dir: None,
        },
        None => start_registry()?,
    };
    let have_skopeo = Command::new("sh")
        .args(["-c", "command -v skopeo && command -v umoci"])
        .output()
        .is_ok_and(|o| o.status.success());
    let runs = args.runs.max(1);
    let (mut cold, mut theirs, mut fresh_lookup) = (Vec::new(), Vec::new(), Vec::new());
    let mut warm = Duration::ZERO;
    const LOOKUPS: u32 = 1000;
    // Work trees are deleted only at the end: ext4 makes file creation slow right after mass
    // deletion (it scans recently freed inodes), which would penalise whichever method runs next.
    let mut keep = Vec::new();
    for run in 0..runs {
        let work = tempfile::tempdir()?;
        // Ours, cold: empty cache, new store, pull + unpack.
        let store = ImageStore::new(settings(work.path(), &reg.addr, &args.image))?;
        let t = Instant::now();
        let p = store.ensure("bench").await?;
        cold.push(t.elapsed());
        // Cached, create-ready lookup from a fresh store (reads the cache on disk).
        let fresh = ImageStore::new(settings(work.path(), &reg.addr, &args.image))?;
        let t = Instant::now();
        let q = fresh.ensure("bench").await?;
        fresh_lookup.push(t.elapsed());
        assert_eq!(p.rootfs, q.rootfs);
        if run == 0 {
            let t = Instant::now();
            for _ in 0..LOOKUPS {
                fresh.ensure("bench").await?;
            }
            warm = t.elapsed() / LOOKUPS;
            let _ = fresh
                .pull_reference(&format!("{}/{}", reg.addr, args.image), &NoProgress)
                .await?;
        }
        if have_skopeo {
            let w = tempfile::tempdir()?;
            theirs.push(skopeo_umoci(&reg.addr, &args.image, w.path())?);
            keep.push(w);
        }
        keep.push(work);
    }
    if let Some(path) = &args.json {
        let rows = json_rows(&cold, &theirs, &fresh_lookup, have_skopeo);
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| path.display().to_string())?;
    }
    let ours = median(cold);
    println!(
        "image-bench: {}/{} ({runs} runs, median)",
        reg.addr, args.image
    );
    println!("{:<44} {:>12} {:>10}", "method", "ms", "ratio");
    if have_skopeo {
        let base = median(theirs);
        println!(
            "{:<44} {:>12} {:>10}",
            "skopeo copy + umoci unpack (baseline)",
            ms(base),
            "1.00x"
        );
        let ratio = base.as_secs_f64() / ours.as_secs_f64();
        println!(
            "{:<44} {:>12} {:>9.2}x",
            "image-store cold pull+unpack",
            ms(ours),
            ratio
        );
        let f = median(fresh_lookup.clone());
        println!(
            "{:<44} {:>12} {:>9.0}x",
            "image-store cached ensure (new store)",
            ms(f),
            base.as_secs_f64() / f.as_secs_f64()
        );
        println!(
            "{:<44} {:>12} {:>9.0}x",
            "image-store cached ensure (warm store)",
            ms(warm),
            base.as_secs_f64() / warm.as_secs_f64()
        );
    } else {
        println!("(skopeo/umoci not installed: no baseline; run tests/fixtures/install.sh)");
        println!("{:<44} {:>12}", "image-store cold pull+unpack", ms(ours));
        println!(
            "{:<44} {:>12}",
            "image-store cached ensure (new store)",
            ms(median(fresh_lookup))
        );
        println!(
            "{:<44} {:>12}",
            "image-store cached ensure (warm store)",
            ms(warm)
        );
    }
    println!("ratio = baseline time / our time (higher is faster)");
    Ok(())
}
