//! Installing an image: resolve, lock, download missing blobs, unpack into a temporary root,
//! rename into place. Everything here runs with the reference's in-process gate held.

use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use oci_client::Reference;

use crate::cache::RootRecord;
use crate::digest::Digest;
use crate::error::ImageError;
use crate::lock::FileLock;
use crate::manifest::parse_config;
use crate::progress::PullProgress;
use crate::pull::{io_err, PullError, Resolved};
use crate::store::{ImageStore, PreparedImage};
use crate::unpack;

/// Layer downloads in flight at once for one image.
const PARALLEL_DOWNLOADS: usize = 4;

impl ImageStore {
    pub(crate) async fn pull(
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
        let total = blobs.iter().fold(0u64, |sum, b| sum.saturating_add(b.1));
        let limit = self.inner.settings.limit;
        if total > limit.bytes {
            return Err(PullError::TooLarge {
                bytes: total,
                limit: limit.bytes,
            });
        }
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
        self.unpack_all(&tmp_root, &blobs, &diff_ids, limit, progress)
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
        mut budget: unpack::Budget,
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
            let stats = tokio::task::spawn_blocking(move || {
                unpack::apply_layer_file(&root, &path, &diff, budget)
            })
            .await
            .map_err(|e| PullError::Task(e.to_string()))?;
            match stats {
                Ok(s) => {
                    budget.spend(&s);
                    tracing::debug!(
                        index,
                        entries = s.entries,
                        bytes = s.uncompressed_bytes,
                        ms = t0.elapsed().as_millis() as u64,
                        "layer applied"
                    )
                }
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
