//! The facade: catalog lookups, `ensure` (cached or pulled once), and the pull pipeline
//! (resolve, lock, download missing blobs, unpack into a temporary root, rename into place).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use futures::{StreamExt, TryStreamExt};
use oci_client::Reference;

use crate::cache::{Cache, RootRecord};
use crate::catalog::{known_images, CatalogEntry, Known};
use crate::digest::Digest;
use crate::error::ImageError;
use crate::lock::FileLock;
use crate::manifest::{parse_config, ImageRuntimeConfig};
use crate::progress::{PullProgress, TracingProgress};
use crate::pull::{io_err, PullError, Registry, Resolved};
use crate::settings::ImageSettings;
use crate::unpack;

/// Layer downloads in flight at once for one image.
const PARALLEL_DOWNLOADS: usize = 4;

/// A root filesystem ready to boot. `rootfs` is shared by every sandbox of this image and
/// **must be treated as read-only**: put a writable layer on top, never write into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedImage {
    pub name: String,
    pub oci_ref: String,
    pub manifest_digest: String,
    pub rootfs: PathBuf,
    pub config: ImageRuntimeConfig,
}

/// The image store. Cheap to clone (an `Arc` inside); `Send + Sync`.
#[derive(Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

struct Inner {
    settings: ImageSettings,
    known: Vec<Known>,
    cache: Cache,
    registry: Registry,
    /// One gate per reference, so parallel callers in this process share one pull.
    gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Roots already looked up, by reference (the fast path of `ensure`).
    ready: RwLock<HashMap<String, PreparedImage>>,
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
    /// returns the read-only flattened root. A cached hit touches no network.
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

    /// The cached root of `oci_ref`, from memory or from the cache's ref records.
    fn cached(&self, oci_ref: &str, name: &str) -> Option<PreparedImage> {
        if let Ok(ready) = self.inner.ready.read() {
            if let Some(p) = ready.get(oci_ref) {
                if p.rootfs.is_dir() {
                    return Some(PreparedImage {
                        name: name.to_string(),
                        ..p.clone()
                    });
                }
            }
        }
        let (digest, rec) = self.inner.cache.lookup_ref(oci_ref)?;
        Some(self.remember(oci_ref, name, &digest, rec))
    }

    fn remember(
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
        };
        if let Ok(mut ready) = self.inner.ready.write() {
            ready.insert(oci_ref.to_string(), p.clone());
        }
        p
    }

    fn gate(&self, oci_ref: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = match self.inner.gates.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        gates.entry(oci_ref.to_string()).or_default().clone()
    }

    async fn pull(
        &self,
        oci_ref: &str,
        name: &str,
        progress: &dyn PullProgress,
        reuse_ref: bool,
    ) -> Result<PreparedImage, ImageError> {
        let gate = self.gate(oci_ref);
        let _held = gate.lock().await;
        if reuse_ref {
            if let Some(p) = self.cached(oci_ref, name) {
                return Ok(p);
            }
        }
        let started = std::time::Instant::now();
        let result = self.pull_locked(oci_ref, name, progress).await;
        match &result {
            Ok(p) => {
                tracing::info!(oci_ref, digest = %p.manifest_digest, ms = started.elapsed().as_millis() as u64, "image pulled")
            }
            Err(err) => tracing::warn!(oci_ref, %err, "image pull failed"),
        }
        result.map_err(|source| ImageError::Pull {
            reference: oci_ref.to_string(),
            source,
        })
    }

    async fn pull_locked(
        &self,
        oci_ref: &str,
        name: &str,
        progress: &dyn PullProgress,
    ) -> Result<PreparedImage, PullError> {
        let cache = &self.inner.cache;
        let resolved = self.inner.registry.resolve(oci_ref).await?;
        let digest = resolved.manifest_digest.clone();
        if let Some(rec) = cache.read_root(&digest) {
            cache
                .record_ref(oci_ref, &digest)
                .map_err(io_err(cache.base()))?;
            return Ok(self.remember(oci_ref, name, &digest, rec));
        }
        let lock_path = cache.lock_path(&digest);
        let _flock = tokio::task::spawn_blocking(move || FileLock::acquire(&lock_path))
            .await
            .map_err(|e| PullError::Task(e.to_string()))?
            .map_err(io_err(&cache.lock_path(&digest)))?;
        if cache.read_root(&digest).is_none() {
            cache.clean_tmp_roots(&digest);
            self.build_root(oci_ref, &resolved, progress).await?;
        }
        let rec = cache.read_root(&digest).ok_or_else(|| PullError::Io {
            path: cache.root_dir(&digest),
            source: std::io::Error::other("root vanished after it was made"),
        })?;
        cache
            .record_ref(oci_ref, &digest)
            .map_err(io_err(cache.base()))?;
        progress.finished(oci_ref);
        Ok(self.remember(oci_ref, name, &digest, rec))
    }

    /// Downloads what is missing and unpacks every layer into a temporary root, renamed to its
    /// final name only when complete.
    async fn build_root(
        &self,
        oci_ref: &str,
        r: &Resolved,
        progress: &dyn PullProgress,
    ) -> Result<(), PullError> {
        let cache = &self.inner.cache;
        let config_bytes = self.inner.registry.config(r).await?;
        let config = parse_config(&config_bytes)?;
        let layers = &r.manifest.layers;
        if config.diff_ids.len() != layers.len() {
            return Err(PullError::LayerCount {
                diff_ids: config.diff_ids.len(),
                layers: layers.len(),
            });
        }
        let mut blobs = Vec::with_capacity(layers.len());
        for l in layers {
            let size = u64::try_from(l.size).map_err(|_| PullError::Size {
                digest: l.digest.clone(),
                expected: 0,
                actual: 0,
            })?;
            blobs.push((Digest::parse(&l.digest)?, size));
        }
        let diff_ids = config
            .diff_ids
            .iter()
            .map(|d| Digest::parse(d))
            .collect::<Result<Vec<_>, _>>()?;
        let total: u64 = blobs.iter().map(|b| b.1).sum();
        let cached: u64 = blobs
            .iter()
            .filter(|(d, s)| cache.has_blob(d, *s))
            .map(|b| b.1)
            .sum();
        progress.started(oci_ref, blobs.len(), total, cached);
        let t0 = std::time::Instant::now();

        // Futures built up front: a closure inside the stream type trips the compiler's
        // higher-ranked lifetime check when the whole future must be Send.
        let fetches: Vec<_> = blobs
            .iter()
            .map(|(d, size)| self.fetch_blob(&r.reference, d, *size, progress))
            .collect();
        futures::stream::iter(fetches)
            .buffer_unordered(PARALLEL_DOWNLOADS)
            .try_collect::<Vec<()>>()
            .await?;
        tracing::debug!(ms = t0.elapsed().as_millis() as u64, "blobs ready");

        let guard = TmpPath(cache.new_tmp_root(&r.manifest_digest));
        let tmp_root = guard.0.clone();
        self.unpack_all(&tmp_root, &blobs, &diff_ids, progress)
            .await
            .and_then(|()| {
                let rec = RootRecord {
                    oci_ref: oci_ref.to_string(),
                    manifest_digest: r.manifest_digest.to_string(),
                    config: config.runtime.clone(),
                };
                let json = serde_json::to_vec_pretty(&rec).map_err(|e| PullError::Io {
                    path: tmp_root.clone(),
                    source: e.into(),
                })?;
                let record = tmp_root.join("image.json");
                std::fs::write(&record, json).map_err(io_err(&record))?;
                let dest = cache.root_dir(&r.manifest_digest);
                std::fs::rename(&tmp_root, &dest).map_err(io_err(&dest))
            })
    }

    async fn unpack_all(
        &self,
        tmp_root: &Path,
        blobs: &[(Digest, u64)],
        diff_ids: &[Digest],
        progress: &dyn PullProgress,
    ) -> Result<(), PullError> {
        let rootfs = tmp_root.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(io_err(&rootfs))?;
        for (index, ((blob, _), diff_id)) in blobs.iter().zip(diff_ids).enumerate() {
            let t0 = std::time::Instant::now();
            progress.unpacking(index, blobs.len());
            let (root, path, diff) = (
                rootfs.clone(),
                self.inner.cache.blob_path(blob),
                diff_id.clone(),
            );
            let stats =
                tokio::task::spawn_blocking(move || unpack::apply_layer_file(&root, &path, &diff))
                    .await
                    .map_err(|e| PullError::Task(e.to_string()))?;
            match stats {
                Ok(s) => tracing::debug!(
                    index,
                    entries = s.entries,
                    bytes = s.uncompressed_bytes,
                    ms = t0.elapsed().as_millis() as u64,
                    "layer applied"
                ),
                Err(source) => {
                    // A blob that does not match its diff_id is bad: drop it so a retry refetches.
                    if matches!(
                        source,
                        unpack::UnpackError::DiffId { .. } | unpack::UnpackError::Read(_)
                    ) {
                        let _ = std::fs::remove_file(self.inner.cache.blob_path(blob));
                    }
                    return Err(PullError::Unpack {
                        index,
                        digest: blob.to_string(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    async fn fetch_blob(
        &self,
        reference: &Reference,
        d: &Digest,
        size: u64,
        progress: &dyn PullProgress,
    ) -> Result<(), PullError> {
        let cache = &self.inner.cache;
        if cache.has_blob(d, size) {
            return Ok(());
        }
        // The guard removes the partial file on error *and* when this future is dropped
        // (a sibling download failed, or the caller went away).
        let tmp = TmpPath(cache.tmp_blob_path());
        self.inner
            .registry
            .blob_to_file(reference, d, size, &tmp.0, progress)
            .await?;
        let dest = cache.blob_path(d);
        std::fs::rename(&tmp.0, &dest).map_err(io_err(&dest))
    }
}

/// Removes a temporary file or directory when dropped (a no-op once it was renamed away).
struct TmpPath(PathBuf);

impl Drop for TmpPath {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.0) {
            Ok(md) if md.is_dir() => {
                let _ = std::fs::remove_dir_all(&self.0);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&self.0);
            }
            Err(_) => {}
        }
    }
}
