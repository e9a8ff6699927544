//! The shell's life: load the plugin, connect, read configuration, serve, stop.

use std::sync::Arc;
use std::time::Duration;

use iii_sdk::IIIClient;
use plugin_api::host::PluginLibrary;

use crate::auth::WorkerToken;
use crate::cli::{trace_payloads_disabled, Args};
use crate::configuration::ConfigReadError;
use crate::serve::{register_all, Dispatcher};

/// How the process ends; see the crate docs for the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Stopped = 0,
    EngineUnreachable = 1,
    BadSetup = 2,
    Refused = 3,
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit as u8)
    }
}

fn fail(exit: Exit, message: impl std::fmt::Display) -> Exit {
    eprintln!("sandbox-libkrun: {message}");
    exit
}

pub async fn run(args: Args, plugin_path: std::path::PathBuf) -> Exit {
    if args
        .namespace
        .as_deref()
        .is_some_and(|ns| ns.trim().is_empty())
    {
        return fail(
            Exit::BadSetup,
            "III_NAMESPACE is set but blank: give it a name or unset it",
        );
    }
    let library = match PluginLibrary::load(&plugin_path) {
        Ok(library) => library,
        Err(e) => return fail(Exit::BadSetup, e),
    };
    let manifest = library.manifest().clone();
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| manifest.adapter.clone());
    tracing::info!(plugin = %plugin_path.display(), adapter = %manifest.adapter, %prefix, "plugin loaded");

    let iii = connect(&args, &manifest.adapter_version);
    if let Err(e) = iii
        .wait_until_registered(Duration::from_secs(args.connect_timeout_secs))
        .await
    {
        if iii.fatal_error().is_some() || matches!(e, iii_sdk::Error::RegistrationRejected { .. }) {
            return fail(
                Exit::Refused,
                format!("the engine refused this worker: {e}"),
            );
        }
        return fail(
            Exit::EngineUnreachable,
            format!("cannot register with the engine at {}: {e}", args.url),
        );
    }

    let config = crate::configuration::read(&iii, &args.config_name).await;
    // The engine answers in order: a refusal of our worker name arrives before this reply,
    // either as the read's own error or as the client's fatal error.
    if let Some(refusal) = iii.fatal_error() {
        return fail(
            Exit::Refused,
            format!("the engine refused this worker: {refusal}"),
        );
    }
    let config = match config {
        Ok(config) => config,
        Err(ConfigReadError::Refused(refusal)) => {
            return fail(
                Exit::Refused,
                format!("the engine refused this worker: {refusal}"),
            )
        }
        Err(e) => return fail(Exit::BadSetup, e),
    };
    let status = Arc::new(crate::bus::BusStatus::new(args.worker_name.clone()));
    let services = Arc::new(crate::services::EngineServices::new(
        iii.clone(),
        args.url.clone(),
        status,
    ));
    let plugin = match library.init(&config, Arc::clone(&services) as _) {
        Ok(plugin) => plugin,
        Err(reason) => {
            return fail(
                Exit::BadSetup,
                format!("configuration `{}`: {reason}", args.config_name),
            )
        }
    };

    let dispatcher = Arc::new(Dispatcher {
        plugin: plugin.clone(),
        token: WorkerToken::from_env(),
        trace_payloads: !trace_payloads_disabled(),
    });
    register_all(&iii, &prefix, &manifest.functions, Arc::clone(&dispatcher));
    tracing::info!(
        worker = %args.worker_name,
        functions = manifest.functions.len(),
        target = env!("SANDBOX_TARGET"),
        "serving"
    );

    // Start-up has finished: from here on a refused or lost connection is replaced, never a
    // reason to exit, since the plugin's sandboxes and worker VMs would go with the process.
    let connector = crate::bus::Connector {
        url: args.url.clone(),
        worker_name: args.worker_name.clone(),
        namespace: args.namespace.clone(),
        version: manifest.adapter_version.clone(),
        prefix,
        functions: manifest.functions.clone(),
        dispatcher,
    };
    let bus = tokio::spawn(crate::bus::keep_connected(
        connector,
        Arc::clone(&services),
        iii,
    ));
    let exit = until_stopped().await;
    bus.abort();
    services.current().shutdown_async().await;
    let _ = tokio::task::spawn_blocking(move || plugin.shutdown()).await;
    exit
}

fn connect(args: &Args, version: &str) -> IIIClient {
    crate::bus::connect(
        &args.url,
        &args.worker_name,
        args.namespace.as_deref(),
        version,
    )
}

/// Waits for SIGINT/SIGTERM (exit 0).
async fn until_stopped() -> Exit {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => return fail(Exit::BadSetup, format!("cannot watch SIGTERM: {e}")),
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Exit::Stopped,
        _ = terminate.recv() => Exit::Stopped,
    }
}
