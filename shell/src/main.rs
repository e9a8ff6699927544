//! `sandbox-libkrun`: the generic iii worker shell.
//!
//! It loads one plugin (a `cdylib` speaking `plugin-api`), connects to the engine with the
//! official `iii-sdk`, reads the configuration once, and registers every function of the
//! plugin's manifest as `<prefix>::<suffix>`, and its family functions as
//! `sandbox::provider::<name>::<suffix>` (`$SANDBOX_LIBKRUN_FAMILY_NAME`, see `serve`). It
//! knows nothing about sandboxes: the only policy it applies itself is the worker-token guard,
//! before the plugin sees a call. A release
//! build carries the default plugins and their helper programs as opaque embedded files
//! (`bundle`), written on first use to `~/.iii/lib/sandbox-libkrun/<version>-<hash>/` and
//! checked on every start.
//!
//! Exit codes: 0 stopped by a signal, 1 lost the engine before start-up finished, 2 a
//! configuration or plugin problem, 3 the engine refused the worker's registration during
//! start-up. Once start-up has finished (configuration read, plugin initialised, functions
//! registered) the process no longer exits for the engine: a lost connection is reconnected,
//! a refused one replaced by a new one with backoff, and the plugin's sandboxes and worker
//! VMs run on meanwhile (`bus`).

// `unsafe` only in `memory` (one malloc call), allowed there by name.
#![deny(unsafe_code)]

mod auth;
mod bundle;
mod bus;
mod cli;
mod configuration;
mod events;
mod inherited;
mod memory;
mod resolve;
mod serve;
mod services;
mod startup;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    inherited::close_on_exec();
    memory::configure();
    memory::cap_trace_payloads();
    let args = cli::Args::parse();
    init_tracing();
    // Before the runtime: it may set environment variables for the plugin's helpers.
    let plugin_path = match resolve::plugin_path(&args) {
        Ok(path) => path,
        Err(reason) => {
            eprintln!("sandbox-libkrun: {reason}");
            return ExitCode::from(startup::Exit::BadSetup as u8);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sandbox-libkrun: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(startup::run(args, plugin_path));
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
