//! Command line and environment of the shell.

use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
use std::path::PathBuf;

use clap::Parser;

/// Default plugin, by name: `libplugin_libkrun.so` (`.dylib` on macOS).
pub const DEFAULT_PLUGIN: &str = "libkrun";

/// The file of the plugin called `name` (`libkrun` -> `libplugin_libkrun.so` on Linux,
/// `libplugin_libkrun.dylib` on macOS: the platform's own library name, as cargo makes it).
pub fn plugin_file(name: &str) -> String {
    format!("{DLL_PREFIX}plugin_{name}{DLL_SUFFIX}")
}

/// The plugin name of a plugin file's name (`libplugin_bwrap.so` -> `bwrap`), if it is one.
pub fn plugin_name(file: &str) -> Option<&str> {
    file.strip_prefix(DLL_PREFIX)?
        .strip_prefix("plugin_")?
        .strip_suffix(DLL_SUFFIX)
}

/// Which plugin to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginChoice {
    /// A plugin library by path.
    File(PathBuf),
    /// One of the plugins embedded in this binary, by name (`libkrun`, `bwrap`).
    Embedded(String),
}

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-libkrun",
    version,
    about = "iii adapter worker running code sandboxes as libkrun microVMs",
    after_help = "Environment: SANDBOX_LIBKRUN_FAMILY_NAME names this adapter among the \
                  providers of iii's `sandbox` router (default `libkrun`; `local` makes it the \
                  router's default provider; empty serves no sandbox::provider::<name>::* \
                  function); see docs/family.md."
)]
pub struct Args {
    /// Plugin to serve: a bare name (`libkrun`, `bwrap`: no `/`, no `.`) selects one embedded
    /// in this binary, anything else is a plugin library's path. Default: the embedded
    /// `libkrun` when this build carries embedded plugins, else `libplugin_libkrun.so` next to
    /// this binary.
    #[arg(long, env = "SANDBOX_LIBKRUN_PLUGIN")]
    pub plugin: Option<String>,

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
    /// The plugin asked for; `embedded` says whether this build carries embedded files.
    pub fn plugin_choice(&self, embedded: bool) -> PluginChoice {
        match &self.plugin {
            Some(value) if !value.is_empty() && !value.contains(['/', '.']) => {
                PluginChoice::Embedded(value.clone())
            }
            Some(value) => PluginChoice::File(PathBuf::from(value)),
            None if embedded => PluginChoice::Embedded(DEFAULT_PLUGIN.into()),
            None => PluginChoice::File(
                std::env::current_exe()
                    .ok()
                    .and_then(|exe| {
                        exe.parent()
                            .map(|dir| dir.join(plugin_file(DEFAULT_PLUGIN)))
                    })
                    .unwrap_or_else(|| PathBuf::from(plugin_file(DEFAULT_PLUGIN))),
            ),
        }
    }
}

/// Whether payloads must stay out of traces and logs (`III_DISABLE_TRACE_PAYLOADS` = 1/true).
pub fn trace_payloads_disabled() -> bool {
    std::env::var("III_DISABLE_TRACE_PAYLOADS")
        .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(plugin: Option<&str>, embedded: bool) -> PluginChoice {
        let mut argv = vec!["sandbox-libkrun"];
        if let Some(p) = plugin {
            argv.extend(["--plugin", p]);
        }
        Args::try_parse_from(argv).unwrap().plugin_choice(embedded)
    }

    #[test]
    fn bare_names_select_embedded_plugins_and_paths_stay_paths() {
        let embedded = |n: &str| PluginChoice::Embedded(n.into());
        let file = |p: &str| PluginChoice::File(PathBuf::from(p));
        assert_eq!(choice(Some("bwrap"), true), embedded("bwrap"));
        assert_eq!(choice(Some("bwrap"), false), embedded("bwrap"));
        assert_eq!(choice(Some("libkrun"), true), embedded("libkrun"));
        assert_eq!(choice(Some("./x.so"), true), file("./x.so"));
        assert_eq!(
            choice(Some("libplugin_bwrap.so"), true),
            file("libplugin_bwrap.so")
        );
        assert_eq!(
            choice(Some("/opt/p/libplugin_bwrap.so"), false),
            file("/opt/p/libplugin_bwrap.so")
        );
        assert_eq!(choice(None, true), embedded("libkrun"));
        match choice(None, false) {
            PluginChoice::File(path) => assert!(path.ends_with(plugin_file("libkrun")), "{path:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_plugin_file_name_and_its_plugin_name_round_trip() {
        #[cfg(target_os = "linux")]
        assert_eq!(plugin_file("bwrap"), "libplugin_bwrap.so");
        #[cfg(target_os = "macos")]
        assert_eq!(plugin_file("bwrap"), "libplugin_bwrap.dylib");
        assert_eq!(plugin_name(&plugin_file("libkrun")), Some("libkrun"));
        assert_eq!(plugin_name("sandbox-agent"), None);
    }
}
