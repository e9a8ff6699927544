//! `iii-test-engine`: runs the test engine until interrupted.
//!
//! Prints one line, `iii-test-engine listening on ws://ADDR`, on stdout once it accepts
//! connections; logs go to stderr (`RUST_LOG` filters them). Exit status: 0 after SIGINT or
//! SIGTERM, 2 for bad arguments or an unreadable `--config` file, 1 when it cannot listen.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use iii_test_engine::{Engine, EngineBuilder};
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser, Debug)]
#[command(version, about = "A small iii engine for tests and local runs")]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:49134")]
    listen: SocketAddr,
    /// Pre-seed configuration entry ID with the JSON in FILE (repeatable).
    #[arg(long = "config", value_name = "ID=FILE.json")]
    config: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
enum ConfigArgError {
    #[error("--config {0}: expected ID=FILE.json")]
    Shape(String),
    #[error("--config {id}: cannot read {path}: {source}")]
    Read {
        id: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--config {id}: {path} is not JSON: {source}")]
    Json {
        id: String,
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn load_config(arg: &str) -> Result<(String, Value), ConfigArgError> {
    let (id, path) = arg
        .split_once('=')
        .filter(|(id, path)| !id.is_empty() && !path.is_empty())
        .ok_or_else(|| ConfigArgError::Shape(arg.to_string()))?;
    let path = PathBuf::from(path);
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigArgError::Read {
        id: id.to_string(),
        path: path.clone(),
        source,
    })?;
    let value = serde_json::from_str(&text).map_err(|source| ConfigArgError::Json {
        id: id.to_string(),
        path,
        source,
    })?;
    Ok((id.to_string(), value))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();

    let mut builder: EngineBuilder = Engine::builder();
    for arg in &args.config {
        match load_config(arg) {
            Ok((id, value)) => builder = builder.with_config(id, value),
            Err(error) => {
                eprintln!("iii-test-engine: {error}");
                return ExitCode::from(2);
            }
        }
    }
    let handle = match builder.start(args.listen).await {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("iii-test-engine: {error}");
            return ExitCode::from(1);
        }
    };
    println!("iii-test-engine listening on {}", handle.url());

    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("iii-test-engine: cannot install signal handlers");
        handle.shutdown().await;
        return ExitCode::from(1);
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    handle.shutdown().await;
    ExitCode::SUCCESS
}
