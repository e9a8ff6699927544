//! Command line and environment of the shell.

use std::path::PathBuf;

use clap::Parser;

/// Default plugin file, looked up next to the binary.
pub const DEFAULT_PLUGIN_FILE: &str = "libplugin_libkrun.so";

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-libkrun",
    version,
    about = "iii adapter worker running code sandboxes as libkrun microVMs"
)]
pub struct Args {
    /// Plugin library to serve; default `libplugin_libkrun.so` next to this binary.
    #[arg(long, env = "SANDBOX_LIBKRUN_PLUGIN")]
    pub plugin: Option<PathBuf>,

    /// Function id prefix; default the plugin's adapter name (so a development plugin can
    /// stand in for `sandbox-libkrun` with `--prefix sandbox-libkrun`).
    #[arg(long, env = "SANDBOX_LIBKRUN_PREFIX")]
    pub prefix: Option<String>,

    /// Engine WebSocket URL.
    #[arg(long, env = "III_URL", default_value = iii_sdk::DEFAULT_ENGINE_URL)]
    pub url: String,

    /// Worker name the engine lists this worker under.
    #[arg(long, env = "III_WORKER_NAME", default_value = "sandbox-libkrun")]
    pub worker_name: String,

    /// Namespace to register in; absent means the engine's default.
    #[arg(long, env = "III_NAMESPACE")]
    pub namespace: Option<String>,

    /// Configuration entry to read at start-up.
    #[arg(long, env = "III_CONFIG_NAME", default_value = "sandbox-libkrun")]
    pub config_name: String,

    /// Seconds to wait for the engine at start-up.
    #[arg(long, default_value_t = 30)]
    pub connect_timeout_secs: u64,
}

impl Args {
    pub fn plugin_path(&self) -> PathBuf {
        if let Some(path) = &self.plugin {
            return path.clone();
        }
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join(DEFAULT_PLUGIN_FILE)))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGIN_FILE))
    }
}

/// Whether payloads must stay out of traces and logs (`III_DISABLE_TRACE_PAYLOADS` = 1/true).
pub fn trace_payloads_disabled() -> bool {
    std::env::var("III_DISABLE_TRACE_PAYLOADS")
        .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
        .unwrap_or(false)
}
