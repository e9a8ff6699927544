//! Shared helpers of the image-store integration tests.
#![allow(dead_code)]

pub mod fake_registry;
pub mod oci;
pub mod real_registry;

use std::collections::BTreeMap;
use std::path::Path;

use image_store::ImageSettings;

/// Settings pointing every catalog entry at `addr` (plain http), `docker.io` mirrored there.
pub fn settings(cache: &Path, addr: &str, custom: &[(&str, &str)]) -> ImageSettings {
    let mut custom_images = BTreeMap::new();
    let mut allow = vec!["python".to_string(), "node".to_string()];
    for (name, repo) in custom {
        custom_images.insert(name.to_string(), format!("{addr}/{repo}"));
        allow.push(name.to_string());
    }
    let mut registry_mirrors = BTreeMap::new();
    registry_mirrors.insert("docker.io".to_string(), addr.to_string());
    ImageSettings {
        auto_install: true,
        image_allowlist: allow,
        custom_images,
        registry_mirrors,
        insecure_registries: vec![addr.to_string()],
        cache_dir: cache.to_path_buf(),
        docker_config: None,
        limit: Default::default(),
    }
}

/// Names of entries directly under `dir` (empty if it does not exist).
pub fn list(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The cache holds no temporary root, no partial download and only finished roots.
pub fn assert_cache_consistent(cache: &Path) {
    let base = cache.join("images");
    let tmp_roots: Vec<_> = list(&base.join("roots"))
        .into_iter()
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(tmp_roots.is_empty(), "temporary roots left: {tmp_roots:?}");
    let partial = list(&base.join("blobs/tmp"));
    assert!(partial.is_empty(), "partial downloads left: {partial:?}");
    for root in list(&base.join("roots")) {
        let dir = base.join("roots").join(&root);
        assert!(
            dir.join("image.json").is_file() && dir.join("rootfs").is_dir(),
            "incomplete root {root}"
        );
    }
}
