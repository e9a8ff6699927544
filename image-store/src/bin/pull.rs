//! sandbox-libkrun-pull: pre-pulls an image into the sandbox image cache with a progress bar.
//!
//! `sandbox-libkrun-pull IMAGE_OR_REF [--cache-dir D] [--insecure H:P]... [--mirror REG=H:P]...
//! [--auth-file F]`. IMAGE_OR_REF is a preset name (`python`, `node`) or an OCI reference.
//! Exit codes: 0 pulled, 1 pull failed (the S-code is printed), 2 bad arguments.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use image_store::{ImageSettings, ImageStore, PullProgress, PRESETS};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser, Debug)]
#[command(version, about = "Pre-pull a sandbox image into the image cache")]
struct Args {
    /// A preset name (python, node) or an OCI reference.
    image: String,
    /// Cache directory (default $HOME/.iii/cache).
    #[arg(long, env = "III_IMAGE_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// A registry `host:port` spoken over plain http (repeatable).
    #[arg(long = "insecure")]
    insecure: Vec<String>,
    /// A registry mirror `registry=host:port`, e.g. `docker.io=127.0.0.1:5000` (repeatable).
    #[arg(long = "mirror")]
    mirror: Vec<String>,
    /// Docker config.json with registry credentials (default $DOCKER_CONFIG/config.json).
    #[arg(long)]
    auth_file: Option<PathBuf>,
}

struct Bar(ProgressBar);

impl PullProgress for Bar {
    fn started(&self, reference: &str, layers: usize, total: u64, cached: u64) {
        self.0.set_length(total);
        self.0.set_position(cached);
        self.0.set_message(format!("{reference}: {layers} layers"));
    }
    fn downloaded(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn unpacking(&self, index: usize, layers: usize) {
        self.0
            .set_message(format!("unpacking layer {}/{layers}", index + 1));
    }
    fn finished(&self, reference: &str) {
        self.0.finish_with_message(format!("{reference}: ready"));
    }
}

fn settings(args: &Args) -> Result<ImageSettings, String> {
    let mut s = ImageSettings::with_defaults();
    if let Some(d) = &args.cache_dir {
        s.cache_dir = d.clone();
    }
    if let Some(f) = &args.auth_file {
        s.docker_config = Some(f.clone());
    }
    s.insecure_registries = args.insecure.clone();
    let mut mirrors = BTreeMap::new();
    for m in &args.mirror {
        let (from, to) = m
            .split_once('=')
            .ok_or_else(|| format!("--mirror {m:?}: expected REGISTRY=HOST[:PORT]"))?;
        mirrors.insert(from.to_string(), to.to_string());
    }
    s.registry_mirrors = mirrors;
    Ok(s)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };
    let oci_ref = PRESETS
        .iter()
        .find(|(name, _)| *name == args.image)
        .map(|(_, r)| r.to_string())
        .unwrap_or_else(|| args.image.clone());
    let store = match ImageStore::new(settings) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            return ExitCode::from(1);
        }
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    match store.pull_reference(&oci_ref, &Bar(bar.clone())).await {
        Ok(p) => {
            bar.finish_and_clear();
            println!("{} {} {}", p.oci_ref, p.manifest_digest, p.rootfs.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            bar.abandon();
            eprintln!("error [{}]: {e}", e.code());
            ExitCode::from(1)
        }
    }
}
