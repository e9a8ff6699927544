//! `trigger`: calls one function through an iii engine and prints its result, like
//! `iii trigger`.
//!
//! `trigger [--url ws://..] [--timeout-ms N] [--namespace NS] FUNCTION_ID [JSON]`
//! - url: `--url`, else `$III_URL`, else `ws://127.0.0.1:49134`; JSON defaults to `{}`.
//! - success: the result as pretty JSON on stdout, exit 0.
//! - failure: `error CODE: MESSAGE` on stderr, exit 1 (the remote code and message unchanged;
//!   `not_connected` / `timeout` for failures on this side). Bad arguments exit 2.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use iii_sdk::protocol::TriggerRequest;
use iii_sdk::runtime::WorkerMetadata;
use iii_sdk::{register_worker, Error, IIIClient, InitOptions, WorkerIdentityMode};
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(about = "Call one function through an iii engine and print its result")]
struct Args {
    /// Engine URL.
    #[arg(long, env = "III_URL", default_value = "ws://127.0.0.1:49134")]
    url: String,
    /// How long to wait for the engine and for the answer, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Namespace to call in (the engine's `default` when absent).
    #[arg(long)]
    namespace: Option<String>,
    /// Function to call, e.g. `sandbox-libkrun::exec`.
    function_id: String,
    /// Request payload as JSON.
    #[arg(default_value = "{}")]
    json: String,
}

/// A failure to report as `error CODE: MESSAGE`.
struct Failure {
    code: String,
    message: String,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let (code, message) = match error {
            Error::Remote { code, message, .. } => (code, message),
            Error::Timeout => ("timeout".into(), "no answer in time".into()),
            Error::NotConnected => ("not_connected".into(), error.to_string()),
            other => ("client_error".into(), other.to_string()),
        };
        Failure { code, message }
    }
}

/// A caller-only client with its own name, so it never collides with a worker's identity.
fn connect(url: &str) -> IIIClient {
    let metadata = WorkerMetadata {
        name: format!("trigger:{}", std::process::id()),
        ..WorkerMetadata::default()
    };
    register_worker(
        url,
        InitOptions {
            metadata: Some(metadata),
            identity: WorkerIdentityMode::Explicit,
            ..InitOptions::default()
        },
    )
}

async fn run(iii: &IIIClient, args: &Args, payload: Value) -> Result<Value, Failure> {
    let started = Instant::now();
    let timeout = Duration::from_millis(args.timeout_ms);
    iii.wait_until_registered(timeout)
        .await
        .map_err(|error| match error {
            Error::Timeout => Failure {
                code: "not_connected".into(),
                message: format!("no engine answered at {} within {timeout:?}", args.url),
            },
            other => other.into(),
        })?;
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    let mut request = TriggerRequest::new(args.function_id.clone(), payload);
    request.timeout_ms = Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    let outcome = match &args.namespace {
        Some(namespace) => iii.trigger(request.namespace(namespace.clone())).await,
        None => iii.trigger(request).await,
    };
    outcome.map_err(|error| match error {
        Error::Timeout => Failure {
            code: "timeout".into(),
            message: format!("no answer from {} within {timeout:?}", args.function_id),
        },
        other => other.into(),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let payload: Value = match serde_json::from_str(&args.json) {
        Ok(payload) => payload,
        Err(error) => {
            eprintln!("error invalid_json: {error}");
            return ExitCode::from(2);
        }
    };
    let iii = connect(&args.url);
    let outcome = run(&iii, &args, payload).await;
    iii.shutdown_async().await;
    match outcome {
        Ok(result) => {
            let text = serde_json::to_string_pretty(&result).unwrap_or_else(|_| result.to_string());
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(Failure { code, message }) => {
            eprintln!("error {code}: {message}");
            ExitCode::from(1)
        }
    }
}
