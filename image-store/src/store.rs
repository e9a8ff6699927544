//! The facade: catalog lookups, `ensure` (cached or pulled once), and the pull pipeline
//! (resolve, lock, download missing blobs, unpack into a temporary root, rename into place).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use crate::cache::{Cache, RootRecord};
use crate::catalog::{known_images, CatalogEntry, Known};
use crate::digest::Digest;
use crate::error::ImageError;
use crate::legacy;
use crate::manifest::ImageRuntimeConfig;
use crate::progress::{PullProgress, TracingProgress};
use crate::pull::Registry;
use crate::settings::ImageSettings;

/// A root filesystem ready to boot. `rootfs` is shared by every sandbox of this image and
/// **must be treated as read-only**: put a writable layer on top, never write into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedImage {
    pub name: String,
    pub oci_ref: String,
    /// The manifest the root was unpacked from; empty for [`ImageSource::Iii025Cache`].
    pub manifest_digest: String,
    pub rootfs: PathBuf,
    pub config: ImageRuntimeConfig,
    pub source: ImageSource,
}

/// Where a prepared root comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSource {
    /// Our cache: pulled and unpacked here, every digest checked.
    Pulled,
    /// The root iii 0.25 left at `<image_cache_dir>/<slug>/`, used read-only after the checks
    /// of `legacy.rs`; 0.25 kept no digest, so its content is not verified. `config` is what
    /// 0.25 saved in `.oci-config.json` (absent fields take their defaults).
    Iii025Cache,
}

/// The image store. Cheap to clone (an `Arc` inside); `Send + Sync`.
#[derive(Clone)]
pub struct ImageStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) settings: ImageSettings,
    pub(crate) known: Vec<Known>,
    pub(crate) cache: Cache,
    pub(crate) registry: Registry,
    /// One gate per reference, so parallel callers in this process share one pull.
    pub(crate) gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Roots already looked up, by reference (the fast path of `ensure`).
    pub(crate) ready: RwLock<HashMap<String, PreparedImage>>,
}

impl ImageStore {
    pub fn new(settings: ImageSettings) -> Result<Self, ImageError> {
        // reqwest is built without a bundled crypto provider; use ring unless the process
        // already chose one (Err means one is installed, which is fine).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cache = Cache::open(&settings.cache_dir).map_err(|source| ImageError::Cache {
            path: settings.cache_dir.display().to_string(),
            source,
        })?;
        let registry = Registry::new(&settings).map_err(|source| ImageError::Pull {
            reference: "(registry setup)".into(),
            source,
        })?;
        Ok(ImageStore {
            inner: Arc::new(Inner {
                known: known_images(&settings),
                settings,
                cache,
                registry,
                gates: Mutex::new(HashMap::new()),
                ready: RwLock::new(HashMap::new()),
            }),
        })
    }

    pub fn settings(&self) -> &ImageSettings {
        &self.inner.settings
    }

    /// The catalog as `catalog::list` returns it: presets first, then custom sorted by name.
    pub fn catalog(&self) -> Vec<CatalogEntry> {
        self.inner
            .known
            .iter()
            .map(|k| CatalogEntry {
                name: k.name.clone(),
                oci_ref: k.oci_ref.clone(),
                kind: k.kind,
                installed: self.cached(&k.oci_ref, &k.name).is_some(),
                allowed: k.allowed,
            })
            .collect()
    }

    /// Resolves a catalog name: not in the catalog or not allowed is S100; not installed with
    /// `auto_install` off is S101; otherwise pulls once (parallel callers share one pull) and
    /// returns the read-only flattened root. A cached hit touches no network; a root iii 0.25
    /// pulled for the reference counts as cached (even with `auto_install` off) when our cache
    /// has none.
    pub async fn ensure(&self, name: &str) -> Result<PreparedImage, ImageError> {
        let known = self.lookup(name)?;
        if let Some(p) = self.cached(&known.oci_ref, name) {
            return Ok(p);
        }
        if !self.inner.settings.auto_install {
            return Err(ImageError::NotInstalled {
                name: name.to_string(),
                oci_ref: known.oci_ref.clone(),
            });
        }
        self.pull(&known.oci_ref, name, &TracingProgress::default(), true)
            .await
    }

    /// Checks, without touching disk or network, that `name` is in the catalog and allowed
    /// (S100 otherwise), so callers can refuse before doing anything costly.
    pub fn check_allowed(&self, name: &str) -> Result<(), ImageError> {
        self.lookup(name).map(|_| ())
    }

    /// Pulls `oci_ref` now (resolving its tag again), reusing cached blobs and roots.
    pub async fn pull_reference(
        &self,
        oci_ref: &str,
        progress: &dyn PullProgress,
    ) -> Result<PreparedImage, ImageError> {
        let name = self
            .inner
            .known
            .iter()
            .find(|k| k.oci_ref == oci_ref)
            .map(|k| k.name.clone())
            .unwrap_or_else(|| oci_ref.to_string());
        self.pull(oci_ref, &name, progress, false).await
    }

    fn lookup(&self, name: &str) -> Result<&Known, ImageError> {
        let known = self.inner.known.iter().find(|k| k.name == name);
        match known {
            None => Err(ImageError::NotInCatalog {
                name: name.to_string(),
                known: self
                    .inner
                    .known
                    .iter()
                    .map(|k| k.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            Some(k) if !k.allowed => Err(ImageError::NotAllowed {
                name: name.to_string(),
            }),
            Some(k) => Ok(k),
        }
    }

    /// The cached root of `oci_ref`: from memory, from the cache's ref records, else the root
    /// iii 0.25 left for it (see `legacy.rs`). Touches no network.
    pub(crate) fn cached(&self, oci_ref: &str, name: &str) -> Option<PreparedImage> {
        if let Ok(ready) = self.inner.ready.read() {
            if let Some(p) = ready.get(oci_ref) {
                let still = match p.source {
                    ImageSource::Pulled => p.rootfs.is_dir(),
                    ImageSource::Iii025Cache => legacy::still_there(&p.rootfs),
                };
                if still {
                    return Some(PreparedImage {
                        name: name.to_string(),
                        ..p.clone()
                    });
                }
            }
        }
        if let Some((digest, rec)) = self.inner.cache.lookup_ref(oci_ref) {
            return Some(self.remember(oci_ref, name, &digest, rec));
        }
        let found = legacy::find(
            &self.inner.settings.cache_dir,
            oci_ref,
            self.inner.settings.limit.entries,
        )?;
        let p = PreparedImage {
            name: name.to_string(),
            oci_ref: oci_ref.to_string(),
            manifest_digest: String::new(),
            rootfs: found.rootfs,
            config: found.config,
            source: ImageSource::Iii025Cache,
        };
        if let Ok(mut ready) = self.inner.ready.write() {
            ready.insert(oci_ref.to_string(), p.clone());
        }
        Some(p)
    }

    pub(crate) fn remember(
        &self,
        oci_ref: &str,
        name: &str,
        digest: &Digest,
        rec: RootRecord,
    ) -> PreparedImage {
        let p = PreparedImage {
            name: name.to_string(),
            oci_ref: oci_ref.to_string(),
            manifest_digest: digest.to_string(),
            rootfs: self.inner.cache.root_dir(digest).join("rootfs"),
            config: rec.config,
            source: ImageSource::Pulled,
        };
        if let Ok(mut ready) = self.inner.ready.write() {
            ready.insert(oci_ref.to_string(), p.clone());
        }
        p
    }

    pub(crate) fn gate(&self, oci_ref: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = match self.inner.gates.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        gates.entry(oci_ref.to_string()).or_default().clone()
    }
}
