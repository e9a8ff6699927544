//! Manifest, index and image-config documents (OCI and Docker v2s2), and platform selection.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Everything we ask a registry for when resolving a reference.
pub const ACCEPTED: &[&str] = &[OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// Layer media types we can unpack (compression is detected from magic bytes anyway).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// Either kind of top-level document; told apart by `mediaType`, else by shape.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnyManifest {
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Option<Vec<Descriptor>>,
}

/// An image manifest we can pull.
#[derive(Debug, Clone)]
pub struct ImageManifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unsupported manifest media type {0:?}")]
    MediaType(String),
    #[error("image manifest without config or layers")]
    Incomplete,
    #[error("unsupported layer media type {0:?}")]
    LayerType(String),
    #[error("no linux/{arch} image in the index (found: {found})")]
    NoPlatform { arch: String, found: String },
}

pub enum Parsed {
    Index(Vec<Descriptor>),
    Image(ImageManifest),
}

pub fn parse(body: &[u8]) -> Result<Parsed, ManifestError> {
    let any: AnyManifest = serde_json::from_slice(body)?;
    let mt = any.media_type.clone().unwrap_or_default();
    let is_index =
        mt == OCI_INDEX || mt == DOCKER_LIST || (mt.is_empty() && any.manifests.is_some());
    if is_index {
        return Ok(Parsed::Index(any.manifests.unwrap_or_default()));
    }
    if !(mt.is_empty() || mt == OCI_MANIFEST || mt == DOCKER_MANIFEST) {
        return Err(ManifestError::MediaType(mt));
    }
    let (Some(config), Some(layers)) = (any.config, any.layers) else {
        return Err(ManifestError::Incomplete);
    };
    if let Some(bad) = layers
        .iter()
        .find(|l| !LAYER_TYPES.contains(&l.media_type.as_str()))
    {
        return Err(ManifestError::LayerType(bad.media_type.clone()));
    }
    Ok(Parsed::Image(ImageManifest { config, layers }))
}

/// The OCI architecture name of this host.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "x86" => "386",
        other => other,
    }
}

/// Picks the linux manifest for `arch`, skipping attestation and unknown-platform entries.
/// For arm64 a `v8` or absent variant is preferred.
pub fn select_platform(entries: &[Descriptor], arch: &str) -> Result<Descriptor, ManifestError> {
    let candidates: Vec<&Descriptor> = entries
        .iter()
        .filter(|d| {
            d.annotations
                .get("vnd.docker.reference.type")
                .map(String::as_str)
                != Some("attestation-manifest")
        })
        .filter(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .collect();
    let preferred = candidates.iter().find(|d| {
        let variant = d.platform.as_ref().and_then(|p| p.variant.as_deref());
        matches!(variant, None | Some("v8"))
    });
    preferred
        .or(candidates.first())
        .map(|d| (*d).clone())
        .ok_or_else(|| ManifestError::NoPlatform {
            arch: arch.to_string(),
            found: entries
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The parts of the image config a sandbox needs to run a process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRuntimeConfig {
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    config: Option<RawRunConfig>,
    rootfs: RawRootfs,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawRunConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawRootfs {
    diff_ids: Vec<String>,
}

/// The image config: run settings and the uncompressed layer digests.
#[derive(Debug, Clone)]
pub struct ImageConfig {
    pub runtime: ImageRuntimeConfig,
    pub diff_ids: Vec<String>,
}

pub fn parse_config(body: &[u8]) -> Result<ImageConfig, ManifestError> {
    let raw: RawConfig = serde_json::from_slice(body)?;
    Ok(ImageConfig {
        runtime: runtime_of(raw.config),
        diff_ids: raw.rootfs.diff_ids,
    })
}

fn runtime_of(run: Option<RawRunConfig>) -> ImageRuntimeConfig {
    let run = run.unwrap_or_default();
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
    ImageRuntimeConfig {
        env: run.env.unwrap_or_default(),
        working_dir: non_empty(run.working_dir),
        entrypoint: run.entrypoint.unwrap_or_default(),
        cmd: run.cmd.unwrap_or_default(),
        user: non_empty(run.user),
    }
}

#[derive(Debug, Deserialize)]
struct RawSavedConfig {
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    config: Option<RawRunConfig>,
}

/// An image config kept without its digest (iii 0.25's `.oci-config.json`): the platform it
/// names and its run settings, each absent field taking its default. No diff_ids are needed,
/// since nothing is unpacked from it.
#[derive(Debug, Clone)]
pub struct SavedConfig {
    pub architecture: Option<String>,
    pub os: Option<String>,
    pub runtime: ImageRuntimeConfig,
}

pub fn parse_saved_config(body: &[u8]) -> Result<SavedConfig, ManifestError> {
    let raw: RawSavedConfig = serde_json::from_slice(body)?;
    Ok(SavedConfig {
        architecture: raw.architecture,
        os: raw.os,
        runtime: runtime_of(raw.config),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(os: &str, arch: &str, variant: Option<&str>, attest: bool) -> Descriptor {
        let mut annotations = BTreeMap::new();
        if attest {
            annotations.insert(
                "vnd.docker.reference.type".into(),
                "attestation-manifest".into(),
            );
        }
        Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: format!("{os}/{arch}/{variant:?}/{attest}"),
            size: 1,
            platform: Some(Platform {
                os: os.into(),
                architecture: arch.into(),
                variant: variant.map(Into::into),
            }),
            annotations,
        }
    }

    #[test]
    fn selection_skips_attestations_and_other_arches() {
        let entries = vec![
            entry("unknown", "unknown", None, true),
            entry("linux", "amd64", None, true),
            entry("linux", "arm64", Some("v7"), false),
            entry("linux", "arm64", Some("v8"), false),
            entry("linux", "amd64", None, false),
        ];
        assert_eq!(
            select_platform(&entries, "amd64").unwrap().digest,
            entries[4].digest
        );
        assert_eq!(
            select_platform(&entries, "arm64").unwrap().digest,
            entries[3].digest
        );
        let err = select_platform(&entries, "riscv64")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("linux/riscv64") && err.contains("linux/amd64"),
            "{err}"
        );
    }

    #[test]
    fn docker_v2s2_manifest_parses_and_unknown_layer_type_is_refused() {
        let good = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
            "config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:aa","size":1},
            "layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":"sha256:bb","size":2}]}"#;
        assert!(matches!(parse(good).unwrap(), Parsed::Image(m) if m.layers.len() == 1));
        let bad = String::from_utf8_lossy(good).replace("rootfs.diff.tar.gzip", "helm.chart");
        assert!(matches!(
            parse(bad.as_bytes()),
            Err(ManifestError::LayerType(_))
        ));
    }

    #[test]
    fn config_runtime_fields_are_read() {
        let cfg = br#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"Cmd":["sh"],
            "WorkingDir":"/w","User":"1000"},"rootfs":{"type":"layers","diff_ids":["sha256:cc"]}}"#;
        let c = parse_config(cfg).unwrap();
        assert_eq!(c.runtime.env, vec!["A=1"]);
        assert_eq!(c.runtime.working_dir.as_deref(), Some("/w"));
        assert_eq!(c.runtime.user.as_deref(), Some("1000"));
        assert_eq!(c.diff_ids, vec!["sha256:cc"]);
    }

    #[test]
    fn a_saved_config_needs_no_rootfs_and_defaults_what_it_lacks() {
        let saved =
            parse_saved_config(br#"{"architecture":"arm64","config":{"Env":["A=1"]}}"#).unwrap();
        assert_eq!(saved.architecture.as_deref(), Some("arm64"));
        assert_eq!(saved.os, None);
        assert_eq!(saved.runtime.env, vec!["A=1"]);
        assert_eq!(saved.runtime.cmd, Vec::<String>::new());
        assert_eq!(saved.runtime.working_dir, None);
        let bare = parse_saved_config(b"{}").unwrap();
        assert_eq!(bare.runtime, ImageRuntimeConfig::default());
        assert!(parse_saved_config(b"{\"architecture\":").is_err());
    }
}
