//! The shell's life: load the plugin, connect, read configuration, serve, stop.

use std::sync::Arc;
use std::time::Duration;

use iii_sdk::IIIClient;
use plugin_api::host::PluginLibrary;

use crate::auth::WorkerToken;
use crate::cli::{trace_payloads_disabled, Args};
use crate::configuration::ConfigReadError;
use crate::serve::{register_all, Dispatcher, Family};

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
    let family_name = match plugin_api::manifest::family_name_from_env() {
        Ok(name) => name,
        Err(e) => return fail(Exit::BadSetup, e),
    };
    let library = match PluginLibrary::load(&plugin_path) {
        Ok(library) => library,
        Err(e) => return fail(Exit::BadSetup, e),
    };
    let manifest = library.manifest().clone();
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| manifest.adapter.clone());
    if let Err(e) = check_prefix(&prefix) {
        return fail(Exit::BadSetup, e);
    }
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
        family: family(family_name, &manifest.family),
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

/// iii's `sandbox` router owns `sandbox::<leaf>` and reaches adapters under
/// `sandbox::provider::`: a prefix there would register ids that belong to the router or to
/// the family surface.
fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix == "sandbox" || prefix.starts_with("sandbox::") {
        return Err(format!(
            "prefix {prefix:?} is iii's sandbox router's namespace; serve under another \
             prefix (the family surface is {}, see docs/family.md)",
            plugin_api::manifest::FAMILY_NAME_ENV
        ));
    }
    Ok(())
}

/// The family surface to register: the name, when the plugin has family functions.
fn family(name: Option<String>, functions: &[plugin_api::FunctionSpec]) -> Option<Family> {
    let name = name?;
    if functions.is_empty() {
        tracing::info!(provider = %name, "the plugin declares no family functions");
        return None;
    }
    tracing::info!(provider = %name, functions = functions.len(), "serving iii's sandbox family");
    Some(Family {
        name,
        functions: functions.to_vec(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routers_namespace_is_no_prefix() {
        for bad in ["sandbox", "sandbox::provider::libkrun", "sandbox::x"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
        for good in [
            "sandbox-libkrun",
            "sandbox-bwrap",
            "sandboxes",
            "my::sandbox",
        ] {
            assert!(check_prefix(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn no_family_without_a_name_or_functions() {
        let spec = plugin_api::FunctionSpec {
            id: "create".into(),
            description: String::new(),
            request_schema: serde_json::json!({}),
            response_schema: serde_json::json!({}),
            token_guarded: false,
        };
        assert!(family(None, std::slice::from_ref(&spec)).is_none());
        assert!(family(Some("libkrun".into()), &[]).is_none());
        let on = family(Some("local".into()), std::slice::from_ref(&spec)).unwrap();
        assert_eq!(on.name, "local");
        assert_eq!(on.functions, vec![spec]);
    }
}
