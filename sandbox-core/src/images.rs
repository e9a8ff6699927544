//! The bridge to `image-store`: settings from our configuration, its S-codes into ours.

use std::path::PathBuf;

use image_store::{ImageError, ImageSettings};

use crate::config::Config;
use crate::error::SandboxError;

pub fn settings(config: &Config) -> ImageSettings {
    ImageSettings {
        auto_install: config.auto_install,
        image_allowlist: config.image_allowlist.clone(),
        custom_images: config.custom_images.clone(),
        registry_mirrors: config.registry_mirrors.clone(),
        insecure_registries: config.insecure_registries.clone(),
        cache_dir: config
            .image_cache_dir
            .clone()
            .unwrap_or_else(image_store::default_cache_dir),
        docker_config: Some(
            config
                .registry_auth_file
                .clone()
                .unwrap_or_else(image_store::default_docker_config),
        ),
        limit: image_store::unpack::Budget {
            bytes: config.max_image_size_mb.saturating_mul(1 << 20),
            ..Default::default()
        },
    }
}

pub fn error(error: ImageError) -> SandboxError {
    let message = error.to_string();
    match error.code() {
        "S100" => SandboxError::ImageNotAllowed(message),
        "S101" => SandboxError::ImageNotInstalled(message),
        _ if !error.retryable() => SandboxError::ImageTooLarge(message),
        _ => SandboxError::PullFailed(message),
    }
}

/// `~/.iii/sandbox`, where sandboxes keep their writable layers unless configured.
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".iii")
        .join("sandbox")
}
