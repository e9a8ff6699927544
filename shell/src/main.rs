//! `sandbox-libkrun`: the generic iii worker shell.
//!
//! It loads one plugin (a `cdylib` speaking `plugin-api`), connects to the engine with the
//! official `iii-sdk`, reads the configuration once, and registers every function of the
//! plugin's manifest as `<prefix>::<suffix>`. It knows nothing about sandboxes: the only
//! policy it applies itself is the worker-token guard, before the plugin sees a call.
//!
//! Exit codes: 0 stopped by a signal, 1 lost the engine before start-up finished, 2 a
//! configuration or plugin problem, 3 the engine refused the worker's registration.

#![forbid(unsafe_code)]

mod auth;
mod cli;
mod configuration;
mod serve;
mod services;
mod startup;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    init_tracing();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sandbox-libkrun: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(startup::run(args));
    // The SDK keeps background tasks; do not wait for them on the way out.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code.into()
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
