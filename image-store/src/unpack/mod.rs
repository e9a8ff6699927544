//! Verified layer unpacking: decompress by magic bytes, apply tar entries with whiteouts and
//! opaque directories, keep owners and modes, and check the uncompressed digest (diff_id).
//! Nothing is ever written outside the root (see `resolve` for how paths are resolved).

mod decompress;
mod entry;
mod pax;
mod pipe;
mod resolve;
mod writers;

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use tar::EntryType;

pub use decompress::Compression;
pub use resolve::ResolveError;

use crate::digest::Digest;
use entry::Meta;

const WHITEOUT_PREFIX: &str = ".wh.";
/// Parallel file writers per layer (see `writers`).
const WRITER_THREADS: usize = 2;
const OPAQUE: &str = ".wh..wh..opq";

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("reading layer: {0}")]
    Read(#[source] io::Error),
    #[error("entry refused: {0}")]
    Unsafe(#[from] ResolveError),
    #[error("hard link {name:?} -> {target:?}: {source}")]
    HardLink {
        name: String,
        target: String,
        #[source]
        source: io::Error,
    },
    #[error("writing {path:?}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("layer content digest {actual} does not match the image config's diff_id {expected}")]
    DiffId { expected: String, actual: String },
    #[error("the image expands past its limit of {limit} {what} (a decompression or inode bomb, or an image too large for `max_image_size_mb`)")]
    TooLarge { what: &'static str, limit: u64 },
}

/// What one image may still expand to on disk, shared by its layers: the guard against
/// decompression bombs (a few KiB of gzip inflating to terabytes) and inode bombs (millions
/// of empty files), which would otherwise fill the cache's disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Uncompressed tar bytes.
    pub bytes: u64,
    /// Tar entries.
    pub entries: u64,
}

impl Default for Budget {
    /// 16 GiB and 4 million entries: several times the largest common base images.
    fn default() -> Self {
        Budget {
            bytes: 16 << 30,
            entries: 4_000_000,
        }
    }
}

impl Budget {
    pub const UNLIMITED: Budget = Budget {
        bytes: u64::MAX,
        entries: u64::MAX,
    };

    /// What is left after `layer` was applied.
    pub fn spend(&mut self, layer: &LayerStats) {
        self.bytes = self.bytes.saturating_sub(layer.uncompressed_bytes);
        self.entries = self.entries.saturating_sub(layer.entries);
    }
}

/// Counts of one applied layer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LayerStats {
    pub compression: Option<Compression>,
    pub entries: u64,
    pub whiteouts: u64,
    pub uncompressed_bytes: u64,
}

/// Applies one layer blob (compressed or not) onto `root` within `budget`, then checks its
/// diff_id. On error the root is left half-written: callers unpack into a temporary root and
/// drop it.
pub fn apply_layer_file(
    root: &Path,
    blob: &Path,
    diff_id: &Digest,
    budget: Budget,
) -> Result<LayerStats, UnpackError> {
    let file = File::open(blob).map_err(UnpackError::Read)?;
    apply_layer_within(
        root,
        BufReader::with_capacity(256 * 1024, file),
        diff_id,
        budget,
    )
}

/// As [`apply_layer_file`], from any buffered reader, without limits (tests, fuzzing).
pub fn apply_layer<R: io::Read + Send + 'static>(
    root: &Path,
    input: BufReader<R>,
    diff_id: &Digest,
) -> Result<LayerStats, UnpackError> {
    apply_layer_within(root, input, diff_id, Budget::UNLIMITED)
}

/// As [`apply_layer_file`], from any buffered reader.
pub fn apply_layer_within<R: io::Read + Send + 'static>(
    root: &Path,
    input: BufReader<R>,
    diff_id: &Digest,
    budget: Budget,
) -> Result<LayerStats, UnpackError> {
    let too_many_bytes = || UnpackError::TooLarge {
        what: "uncompressed bytes",
        limit: budget.bytes,
    };
    let mut pipe = pipe::Pipe::start(input, budget.bytes).map_err(UnpackError::Read)?;
    let applied = apply_entries(root, &mut pipe, budget.entries);
    let (entries, whiteouts) = match applied {
        Ok(counts) => counts,
        Err(e) => {
            // The producer cutting the stream at the limit shows up here as a truncated tar.
            return match pipe.abandon() {
                Err(verdict) if pipe::is_over_limit(&verdict) => Err(too_many_bytes()),
                _ => Err(e),
            };
        }
    };
    // A broken stream is reported as such, even when tar saw a clean end before it.
    let produced = pipe.finish().map_err(|e| {
        if pipe::is_over_limit(&e) {
            too_many_bytes()
        } else {
            UnpackError::Read(e)
        }
    })?;
    if &produced.digest != diff_id {
        return Err(UnpackError::DiffId {
            expected: diff_id.to_string(),
            actual: produced.digest.to_string(),
        });
    }
    Ok(LayerStats {
        compression: Some(produced.compression),
        entries,
        whiteouts,
        uncompressed_bytes: produced.bytes,
    })
}

/// Applies every tar entry; returns (entries, whiteouts).
fn apply_entries(
    root: &Path,
    input: &mut dyn io::Read,
    max_entries: u64,
) -> Result<(u64, u64), UnpackError> {
    let mut archive = tar::Archive::new(input);
    let mut layer = Layer {
        root,
        written: HashSet::new(),
        // SAFETY: geteuid has no preconditions and cannot fail.
        chown: unsafe { libc::geteuid() } == 0,
        parent_cache: None,
        writers: writers::Writers::new(WRITER_THREADS).map_err(UnpackError::Read)?,
        queued: HashSet::new(),
        dir_mtimes: Vec::new(),
    };
    let (mut entries, mut whiteouts) = (0, 0);
    let mut run = || -> Result<(), UnpackError> {
        for item in archive.entries().map_err(UnpackError::Read)? {
            let mut e = item.map_err(UnpackError::Read)?;
            entries += 1;
            if entries > max_entries {
                return Err(UnpackError::TooLarge {
                    what: "entries",
                    limit: max_entries,
                });
            }
            if layer.apply(&mut e)? {
                whiteouts += 1;
            }
        }
        Ok(())
    };
    let result = run();
    // Always wait for queued files, so nothing is written after we return.
    let drained = layer.settle();
    result?;
    drained?;
    // Directory mtimes last: writing inside a directory changes its mtime. Deepest first.
    let mut dirs = std::mem::take(&mut layer.dir_mtimes);
    dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (path, mtime) in dirs {
        if let Err(source) = entry::set_path_mtime(&path, mtime) {
            return Err(write_err(&path, source));
        }
    }
    Ok((entries, whiteouts))
}

struct Layer<'a> {
    root: &'a Path,
    /// Paths written by this layer, so an opaque marker spares them.
    written: HashSet<PathBuf>,
    chown: bool,
    /// The last resolved parent (entries come grouped by directory, so this saves a
    /// resolution per file); dropped by every entry that could change a resolution.
    parent_cache: Option<(Vec<OsString>, PathBuf)>,
    writers: writers::Writers,
    /// Paths queued to the writers since they were last idle.
    queued: HashSet<PathBuf>,
    /// Directory entries of this layer and their mtimes, applied when the layer is done.
    dir_mtimes: Vec<(PathBuf, u64)>,
}

impl Layer<'_> {
    /// Waits for every queued file (a barrier before anything that removes, links or
    /// creates a symlink).
    fn settle(&mut self) -> Result<(), UnpackError> {
        self.queued.clear();
        self.writers
            .wait_idle()
            .map_err(|(path, source)| UnpackError::Write { path, source })
    }

    fn parent_dir(&mut self, comps: &[OsString]) -> Result<PathBuf, UnpackError> {
        if let Some((cached, path)) = &self.parent_cache {
            if cached.as_slice() == comps {
                return Ok(path.clone());
            }
        }
        let path = resolve::resolve_dir(self.root, comps, true)?;
        self.parent_cache = Some((comps.to_vec(), path.clone()));
        Ok(path)
    }

    /// Applies one entry; returns true for a whiteout.
    fn apply<R: io::Read>(&mut self, e: &mut tar::Entry<'_, R>) -> Result<bool, UnpackError> {
        let name = e.path().map_err(UnpackError::Read)?.into_owned();
        let mut comps = resolve::split(&name)?;
        let Some(last) = comps.pop() else {
            return Ok(false); // the root itself ("./"): keep our root's own metadata
        };
        let parent = self.parent_dir(&comps)?;
        let kind = e.header().entry_type();
        if !matches!(kind, EntryType::Regular | EntryType::Continuous) {
            // Only a regular file can never turn a directory on the cached path into a
            // symlink (symlinks and hard links to symlinks could), so anything else drops it.
            self.parent_cache = None;
        }
        let last_str = last.to_string_lossy();
        if last_str.starts_with(WHITEOUT_PREFIX) {
            self.parent_cache = None; // removals may delete a cached directory
            self.settle()?;
        }
        if last_str == OPAQUE {
            entry::clear_opaque(&parent, &self.written)
                .map_err(|source| write_err(&parent, source))?;
            return Ok(true);
        }
        if let Some(hidden) = last_str.strip_prefix(WHITEOUT_PREFIX) {
            let target = parent.join(hidden);
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(ResolveError::Empty(name.display().to_string()).into());
            }
            entry::clear(&target, false).map_err(|source| write_err(&target, source))?;
            return Ok(true);
        }
        let path = parent.join(&last);
        let pax = pax::read(e).map_err(UnpackError::Read)?;
        let h = e.header();
        let meta = Meta {
            mode: h.mode().map_err(UnpackError::Read)?,
            // Empty numeric fields read as 0, as Go's archive/tar (which wrote most layers) does.
            uid: pax.uid.unwrap_or_else(|| h.uid().unwrap_or(0)),
            gid: pax.gid.unwrap_or_else(|| h.gid().unwrap_or(0)),
            mtime: h.mtime().unwrap_or(0),
            chown: self.chown,
        };
        let size = e.header().size().unwrap_or(u64::MAX);
        let small_file = matches!(kind, EntryType::Regular | EntryType::Continuous)
            && size <= writers::SMALL_FILE;
        if small_file && !self.queued.contains(&path) {
            let mut data = Vec::with_capacity(size as usize);
            io::Read::read_to_end(e, &mut data).map_err(UnpackError::Read)?;
            self.written.insert(path.clone());
            self.queued.insert(path.clone());
            let job = writers::Job {
                path,
                data,
                meta,
                xattrs: pax.xattrs,
            };
            self.writers
                .submit(job)
                .map_err(|(path, source)| UnpackError::Write { path, source })?;
            return Ok(false);
        }
        // Directories only wait when the same path is still queued; everything else may
        // remove, link or make a symlink, so it waits for every queued file.
        if kind != EntryType::Directory || self.queued.contains(&path) {
            self.settle()?;
        }
        let result = match kind {
            EntryType::Directory => {
                self.dir_mtimes.push((path.clone(), meta.mtime));
                entry::write_dir(&path, &meta)
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                entry::write_file(&path, e, &meta).map(|_| ())
            }
            EntryType::Symlink => {
                let target = link_name(e)?;
                entry::write_symlink(&path, &target, &meta)
            }
            EntryType::Link => return self.hardlink(e, &name, &path).map(|_| false),
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let dev = (
                    h.device_major().ok().flatten().unwrap_or(0),
                    h.device_minor().ok().flatten().unwrap_or(0),
                );
                match entry::write_special(&path, kind, dev, &meta) {
                    // Unprivileged unpack: device nodes cannot be made; skip, as rootless tools do.
                    Err(err) if err.kind() == io::ErrorKind::PermissionDenied => {
                        tracing::debug!(path = %path.display(), "skipping device node (no privilege)");
                        Ok(())
                    }
                    other => other,
                }
            }
            other => {
                tracing::debug!(?other, name = %name.display(), "skipping unsupported tar entry type");
                return Ok(false);
            }
        };
        result.map_err(|source| write_err(&path, source))?;
        pax::apply_xattrs(&path, &pax.xattrs);
        self.written.insert(path);
        Ok(false)
    }

    fn hardlink<R: io::Read>(
        &mut self,
        e: &tar::Entry<'_, R>,
        name: &Path,
        path: &Path,
    ) -> Result<(), UnpackError> {
        let target = link_name(e)?;
        let mut comps: Vec<OsString> = resolve::split(&target)?;
        let err = |source| UnpackError::HardLink {
            name: name.display().to_string(),
            target: target.display().to_string(),
            source,
        };
        let last = comps
            .pop()
            .ok_or_else(|| err(io::Error::new(io::ErrorKind::InvalidInput, "empty target")))?;
        let dir = resolve::resolve_dir(self.root, &comps, false)?;
        entry::write_hardlink(path, &dir.join(last)).map_err(err)?;
        self.written.insert(path.to_path_buf());
        Ok(())
    }
}

fn link_name<R: io::Read>(e: &tar::Entry<'_, R>) -> Result<PathBuf, UnpackError> {
    e.link_name()
        .map_err(UnpackError::Read)?
        .map(|p| p.into_owned())
        .ok_or_else(|| {
            UnpackError::Read(io::Error::new(
                io::ErrorKind::InvalidData,
                "link without target",
            ))
        })
}

fn write_err(path: &Path, source: io::Error) -> UnpackError {
    UnpackError::Write {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests;
