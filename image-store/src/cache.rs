//! On-disk cache layout under `<cache_dir>/images/`:
//!
//! ```text
//! blobs/sha256/<hex>      verified blobs (config and layers), by digest
//! blobs/tmp/              downloads in progress (renamed into place once verified)
//! roots/<hex>/image.json  the record of a finished root (written before the rename)
//! roots/<hex>/rootfs/     the flattened, read-only root of manifest <hex>
//! roots/.tmp-<hex>-*      roots being unpacked; never trusted, removed by the next pull
//! refs/<sha256 of ref>    the manifest digest a reference resolved to
//! locks/<hex>.lock        flock held while a root is being made
//! ```
//!
//! A root exists under its final name only once complete, so an interrupted pull leaves
//! nothing a later lookup would trust.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::manifest::ImageRuntimeConfig;

/// Stored next to each finished root.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RootRecord {
    pub oci_ref: String,
    pub manifest_digest: String,
    pub config: ImageRuntimeConfig,
}

#[derive(Debug, Clone)]
pub struct Cache {
    base: PathBuf,
}

/// Leftovers older than this belong to no live pull.
const STALE_AFTER: Duration = Duration::from_secs(6 * 3600);

static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

impl Cache {
    pub fn open(cache_dir: &Path) -> io::Result<Cache> {
        let base = cache_dir.join("images");
        for sub in ["blobs/sha256", "blobs/tmp", "roots", "refs", "locks"] {
            fs::create_dir_all(base.join(sub))?;
        }
        let cache = Cache { base };
        cache.remove_abandoned(STALE_AFTER);
        Ok(cache)
    }

    /// Removes temporary files and roots left by pulls that died long ago (a crash, a kill):
    /// old enough that no live pull can still own them. Recent ones are left to their owner
    /// (or, for roots, to the next pull of that image, which cleans them under its lock).
    pub fn remove_abandoned(&self, older_than: Duration) {
        let stale = |p: &Path| {
            fs::symlink_metadata(p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= older_than)
        };
        let dirs = [
            (self.base.join("blobs/tmp"), ""),
            (self.base.join("roots"), ".tmp-"),
            (self.base.join("refs"), ".tmp-"),
        ];
        for (dir, prefix) in dirs {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                let path = e.path();
                if !e.file_name().to_string_lossy().starts_with(prefix) || !stale(&path) {
                    continue;
                }
                let res = if path.is_dir() {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
                match res {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "removed abandoned pull leftover")
                    }
                    Err(err) => {
                        tracing::warn!(path = %path.display(), %err, "could not remove leftover")
                    }
                }
            }
        }
    }

    pub fn base(&self) -> &Path {
        &self.base
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.base.join("blobs/sha256").join(d.hex())
    }

    /// A blob is reused only with the expected size; its content is checked again through the
    /// layer's diff_id when unpacked.
    pub fn has_blob(&self, d: &Digest, size: u64) -> bool {
        fs::metadata(self.blob_path(d)).is_ok_and(|m| m.is_file() && m.len() == size)
    }

    pub fn tmp_blob_path(&self) -> PathBuf {
        self.base.join("blobs/tmp").join(unique())
    }

    pub fn root_dir(&self, d: &Digest) -> PathBuf {
        self.base.join("roots").join(d.hex())
    }

    pub fn read_root(&self, d: &Digest) -> Option<RootRecord> {
        let dir = self.root_dir(d);
        let text = fs::read(dir.join("image.json")).ok()?;
        let rec: RootRecord = serde_json::from_slice(&text).ok()?;
        dir.join("rootfs").is_dir().then_some(rec)
    }

    pub fn new_tmp_root(&self, d: &Digest) -> PathBuf {
        self.base
            .join("roots")
            .join(format!(".tmp-{}-{}", d.hex(), unique()))
    }

    /// Removes leftovers of interrupted unpacks of `d`; call with `d`'s lock held.
    pub fn clean_tmp_roots(&self, d: &Digest) {
        let prefix = format!(".tmp-{}-", d.hex());
        let Ok(rd) = fs::read_dir(self.base.join("roots")) else {
            return;
        };
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                if let Err(err) = fs::remove_dir_all(e.path()) {
                    tracing::warn!(path = %e.path().display(), %err, "could not remove stale root");
                }
            }
        }
    }

    pub fn lock_path(&self, d: &Digest) -> PathBuf {
        self.base.join("locks").join(format!("{}.lock", d.hex()))
    }

    fn ref_path(&self, oci_ref: &str) -> PathBuf {
        self.base
            .join("refs")
            .join(Digest::of(oci_ref.as_bytes()).hex())
    }

    pub fn ref_digest(&self, oci_ref: &str) -> Option<Digest> {
        let text = fs::read_to_string(self.ref_path(oci_ref)).ok()?;
        Digest::parse(text.trim()).ok()
    }

    /// The root a reference resolved to before, if it is still complete.
    pub fn lookup_ref(&self, oci_ref: &str) -> Option<(Digest, RootRecord)> {
        let d = self.ref_digest(oci_ref)?;
        let rec = self.read_root(&d)?;
        Some((d, rec))
    }

    pub fn record_ref(&self, oci_ref: &str, d: &Digest) -> io::Result<()> {
        let tmp = self.base.join("refs").join(format!(".tmp-{}", unique()));
        let mut f = fs::File::create(&tmp)?;
        f.write_all(d.as_str().as_bytes())?;
        drop(f);
        fs::rename(&tmp, self.ref_path(oci_ref))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_counts_only_once_complete_and_refs_point_at_it() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path()).unwrap();
        let d = Digest::of(b"manifest");
        assert!(c.read_root(&d).is_none());
        let tmp = c.new_tmp_root(&d);
        fs::create_dir_all(tmp.join("rootfs")).unwrap();
        let rec = RootRecord {
            oci_ref: "r".into(),
            manifest_digest: d.to_string(),
            config: Default::default(),
        };
        fs::write(tmp.join("image.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
        assert!(
            c.read_root(&d).is_none(),
            "a temporary root must not be trusted"
        );
        let stale = c.new_tmp_root(&d);
        fs::create_dir_all(&stale).unwrap();
        fs::rename(&tmp, c.root_dir(&d)).unwrap();
        assert!(c.read_root(&d).is_some());
        c.clean_tmp_roots(&d);
        assert!(!stale.exists());
        assert!(c.lookup_ref("r").is_none());
        // Abandoned leftovers go; finished roots stay.
        let partial = c.tmp_blob_path();
        fs::write(&partial, b"half").unwrap();
        let orphan = c.new_tmp_root(&Digest::of(b"other"));
        fs::create_dir_all(orphan.join("rootfs")).unwrap();
        c.remove_abandoned(Duration::from_secs(3600));
        assert!(
            partial.exists() && orphan.exists(),
            "recent leftovers may belong to a live pull"
        );
        c.remove_abandoned(Duration::ZERO);
        assert!(!partial.exists() && !orphan.exists());
        assert!(c.read_root(&d).is_some());
        c.record_ref("r", &d).unwrap();
        assert_eq!(c.lookup_ref("r").unwrap().0, d);
    }
}
