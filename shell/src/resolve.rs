//! Where the plugin comes from, and the embedded files put in place before it loads.
//!
//! Runs in `main` before the async runtime starts: it may set environment variables, which
//! is only sound while the process has one thread.

use std::path::PathBuf;
use std::time::Instant;

use crate::bundle;
use crate::cli::{plugin_file, plugin_name, Args, PluginChoice};

/// Where a build's embedded files go: `$HOME/.iii/lib/sandbox-libkrun/` (`<version>-<hash>/`
/// below it).
fn base_dir() -> Result<PathBuf, String> {
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".iii/lib/sandbox-libkrun")),
        None => Err(
            "HOME is not set: the embedded files go to ~/.iii/lib/sandbox-libkrun/; set HOME"
                .into(),
        ),
    }
}

/// The plugin library to load. In a build with embedded files, first writes or checks them
/// (whatever plugin is asked for) and points each helper variable at its extracted file,
/// unless the operator set it.
pub fn plugin_path(args: &Args) -> Result<PathBuf, String> {
    let choice = args.plugin_choice(!bundle::is_empty());
    if bundle::is_empty() {
        return match choice {
            PluginChoice::File(path) => Ok(path),
            PluginChoice::Embedded(name) => Err(format!(
                "--plugin {name}: this build of sandbox-libkrun carries no embedded plugins \
                 (a release build does: scripts/release.sh, or cargo build with \
                 SANDBOX_LIBKRUN_EMBED_DIR set); give --plugin a plugin library's path instead, \
                 e.g. --plugin /path/to/{}",
                plugin_file(&name)
            )),
        };
    }
    if let PluginChoice::Embedded(name) = &choice {
        if !bundle::contains(&plugin_file(name)) {
            let carried: Vec<_> = bundle::names()
                .into_iter()
                .filter_map(plugin_name)
                .collect();
            return Err(format!(
                "--plugin {name}: no such embedded plugin (this build carries: {})",
                carried.join(", ")
            ));
        }
    }

    let started = Instant::now();
    let installed = bundle::install(&base_dir()?).map_err(|e| e.to_string())?;
    for (name, reason) in &installed.replaced {
        tracing::warn!(file = %installed.dir.join(name).display(), %reason,
            "an extracted file did not match this build: rewritten");
    }
    tracing::info!(dir = %installed.dir.display(), first_use = installed.created,
        replaced = installed.replaced.len(), elapsed_ms = started.elapsed().as_millis() as u64,
        "embedded files ready");

    for (var, name) in bundle::helper_env() {
        match std::env::var_os(var).filter(|v| !v.is_empty()) {
            Some(value) => {
                tracing::info!(%var, value = %PathBuf::from(value).display(),
                    "set by the operator: not pointed at the embedded file")
            }
            // Sound: main calls this before any other thread exists.
            None => std::env::set_var(var, installed.dir.join(name)),
        }
    }
    Ok(match choice {
        PluginChoice::File(path) => path,
        PluginChoice::Embedded(name) => installed.dir.join(plugin_file(&name)),
    })
}
