//! What the adapter's configuration tells the image store, and the built-in presets.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::unpack::Budget;

/// Preset catalog names and the OCI references they resolve to.
pub const PRESETS: &[(&str, &str)] = &[
    ("python", "docker.io/library/python:3.12-slim"),
    ("node", "docker.io/library/node:22-slim"),
];

/// Image settings, built by sandbox-core from the adapter's configuration keys.
#[derive(Debug, Clone, Default)]
pub struct ImageSettings {
    /// `auto_install`: pull a missing image on first use; false gives S101 instead.
    pub auto_install: bool,
    /// `image_allowlist`: names that may be used; empty denies every image (S100).
    pub image_allowlist: Vec<String>,
    /// `custom_images`: extra catalog entries, name -> OCI reference.
    pub custom_images: BTreeMap<String, String>,
    /// `registry_mirrors`: registry host (e.g. `docker.io`) -> mirror `host[:port]`.
    pub registry_mirrors: BTreeMap<String, String>,
    /// `insecure_registries`: exact `host:port` entries spoken over plain http.
    pub insecure_registries: Vec<String>,
    /// `image_cache_dir`: default `$HOME/.iii/cache`.
    pub cache_dir: PathBuf,
    /// `registry_auth_file`: Docker `config.json` with `auths`; default see [`default_docker_config`].
    pub docker_config: Option<PathBuf>,
    /// What one image may weigh: its layers' compressed total and what they expand to
    /// (`max_image_size_mb`), and its tar entries.
    pub limit: Budget,
}

/// `$HOME/.iii/cache` (or `./.iii/cache` when HOME is unset).
pub fn default_cache_dir() -> PathBuf {
    home().join(".iii").join("cache")
}

/// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
pub fn default_docker_config() -> PathBuf {
    match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => PathBuf::from(dir).join("config.json"),
        None => home().join(".docker").join("config.json"),
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

impl ImageSettings {
    /// Settings with the documented defaults: auto_install on, presets allowed, default paths.
    pub fn with_defaults() -> Self {
        ImageSettings {
            auto_install: true,
            image_allowlist: PRESETS.iter().map(|(n, _)| n.to_string()).collect(),
            cache_dir: default_cache_dir(),
            docker_config: Some(default_docker_config()),
            ..Default::default()
        }
    }
}
