//! One log on disk, written within its bound: every write is split at the limit, the full
//! file renamed to `<name>.1` and a new one started. Opened without following links and
//! refusing anything but a regular file: a log's directory may be one something else wrote
//! (a worker's `logs/`, which older versions let the guest write).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::rotated;

/// Flags of every open here: no link followed, no blocking open (a FIFO planted where a log
/// should be), never a controlling terminal.
const GUARDED: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

/// How a log begins when it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Empty: an older rotation removed, the file truncated (one run's output only).
    Fresh,
    /// After what earlier runs wrote (a worker's output across its restarts), counted against
    /// the limit; halves an older version let grow past it are cut to their last bytes first.
    Append,
}

/// A log file that never grows past its limit; see the crate's documentation.
pub struct BoundedFile {
    path: PathBuf,
    /// None once the file could not be written: the rest is dropped.
    file: Option<File>,
    written: u64,
    limit: u64,
}

impl BoundedFile {
    /// Opens the log at `path` for writing, each of its files at most `limit` bytes (at
    /// least 1). Errors: a link or anything but a regular file at `path` (left as it is), or
    /// the file cannot be made.
    pub fn open(path: &Path, limit: u64, start: Start) -> io::Result<BoundedFile> {
        let limit = limit.max(1);
        let older = rotated(path);
        let (file, written) = match start {
            Start::Fresh => {
                remove_if_present(&older)?;
                (open_write(path, false)?, 0)
            }
            Start::Append => {
                // Only ever our own rotation's name: anything else there goes.
                remove_unless_regular(&older)?;
                cut_to_tail(&older, limit)?;
                let file = open_write(path, true)?;
                let length = file.metadata()?.len();
                if length > limit {
                    drop(file);
                    std::fs::rename(path, &older)?;
                    cut_to_tail(&older, limit)?;
                    (create_new(path)?, 0)
                } else {
                    (file, length)
                }
            }
        };
        Ok(BoundedFile {
            path: path.to_path_buf(),
            file: Some(file),
            written,
            limit,
        })
    }

    /// Appends `bytes`, rotating as often as the limit asks. Never fails: a log that cannot
    /// be written (a full disk, its directory removed) says so once in the adapter's log and
    /// drops the rest, so whoever feeds it is never stalled.
    pub fn write(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.written >= self.limit {
                self.rotate();
            }
            let Some(file) = &mut self.file else { return };
            let room = usize::try_from(self.limit - self.written).unwrap_or(usize::MAX);
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            if let Err(e) = file.write_all(now) {
                tracing::warn!(log = %self.path.display(), "stops being written: {e}");
                self.file = None;
                return;
            }
            self.written += now.len() as u64;
            bytes = rest;
        }
    }

    fn rotate(&mut self) {
        self.written = 0;
        self.file = None;
        let renamed = std::fs::rename(&self.path, rotated(&self.path));
        match renamed.and_then(|()| create_new(&self.path)) {
            Ok(file) => self.file = Some(file),
            Err(e) => {
                tracing::warn!(log = %self.path.display(), "cannot rotate, stops being written: {e}")
            }
        }
    }
}

/// Opens `path` to write (appending or truncating), creating it owner-only if missing.
fn open_write(path: &Path, append: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    if append {
        options.append(true);
    } else {
        options.write(true).truncate(true);
    }
    let opened = options
        .create(true)
        .mode(0o600)
        .custom_flags(GUARDED)
        .open(path);
    regular(path, opened)
}

/// Creates `path` (owner-only); whatever appeared there meanwhile makes it fail, never reused.
fn create_new(path: &Path) -> io::Result<File> {
    let opened = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(GUARDED)
        .open(path);
    regular(path, opened)
}

/// Opens `path` to read it; `None` if it does not exist.
pub(crate) fn open_read(path: &Path) -> io::Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(GUARDED)
        .open(path);
    match opened {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        opened => regular(path, opened).map(Some),
    }
}

fn regular(path: &Path, opened: io::Result<File>) -> io::Result<File> {
    let refused = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {what}: refused", path.display()),
        )
    };
    let file = opened.map_err(|e| match e.raw_os_error() {
        // What O_NOFOLLOW answers for a link.
        Some(libc::ELOOP) => refused("a symbolic link"),
        // What a non-blocking open for writing answers for a FIFO nobody reads.
        Some(libc::ENXIO) => refused("a FIFO or a device"),
        _ => e,
    })?;
    if !file.metadata()?.file_type().is_file() {
        return Err(refused("not a regular file"));
    }
    Ok(file)
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes what is at `path` if it is not a regular file (a link itself, never its target).
fn remove_unless_regular(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() => std::fs::remove_file(path),
        _ => Ok(()),
    }
}

/// Cuts the file at `path` to its last `limit` bytes if it holds more: the tail is copied
/// (streamed, not held in memory) to a new file beside it, renamed over it.
fn cut_to_tail(path: &Path, limit: u64) -> io::Result<()> {
    let Some(mut file) = open_read(path)? else {
        return Ok(());
    };
    let length = file.metadata()?.len();
    if length <= limit {
        return Ok(());
    }
    file.seek(SeekFrom::Start(length - limit))?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    remove_if_present(&temporary)?;
    let mut kept = create_new(&temporary)?;
    io::copy(&mut io::Read::take(file, limit), &mut kept)?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(path: &Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    #[test]
    fn no_file_ever_passes_the_limit_and_the_newest_bytes_are_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let mut log = BoundedFile::open(&path, 10, Start::Fresh).unwrap();
        log.write(b"0123456");
        log.write(b"789abcdefghij");
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdefghij");
        assert_eq!(std::fs::read(rotated(&path)).unwrap(), b"0123456789");
        // One write far over the limit: split, only the last two files' worth kept.
        log.write(&[b'x'; 95]);
        log.write(b"end");
        assert_eq!(size(&path), 8);
        assert_eq!(size(&rotated(&path)), 10);
        assert!(std::fs::read(&path).unwrap().ends_with(b"end"));
    }

    #[test]
    fn a_fresh_start_empties_the_log_and_an_append_continues_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        std::fs::write(&path, "old").unwrap();
        std::fs::write(rotated(&path), "older").unwrap();
        let mut log = BoundedFile::open(&path, 8, Start::Append).unwrap();
        log.write(b"new");
        assert_eq!(std::fs::read(&path).unwrap(), b"oldnew");
        assert_eq!(std::fs::read(rotated(&path)).unwrap(), b"older");
        log.write(b"abc");
        assert_eq!(std::fs::read(&path).unwrap(), b"c");
        assert_eq!(std::fs::read(rotated(&path)).unwrap(), b"oldnewab");
        drop(log);
        BoundedFile::open(&path, 8, Start::Fresh).unwrap();
        assert_eq!(size(&path), 0);
        assert!(!rotated(&path).exists());
    }

    #[test]
    fn an_append_cuts_halves_an_older_version_let_grow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        std::fs::write(&path, "0123456789").unwrap();
        std::fs::write(rotated(&path), "abcdefghij").unwrap();
        let mut log = BoundedFile::open(&path, 4, Start::Append).unwrap();
        // The oversized file became the older half, cut to its tail; the older one is gone.
        assert_eq!(std::fs::read(rotated(&path)).unwrap(), b"6789");
        assert_eq!(size(&path), 0);
        log.write(b"xy");
        assert_eq!(std::fs::read(&path).unwrap(), b"xy");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 2, "no temporary left");
    }

    #[test]
    fn links_and_fifos_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "keep").unwrap();
        let linked = dir.path().join("linked.log");
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        for start in [Start::Fresh, Start::Append] {
            let error = BoundedFile::open(&linked, 8, start).err().unwrap();
            assert!(error.to_string().contains("symbolic link"), "{error}");
        }
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
        // A link as the older half is replaced by a rotation, never written through.
        let path = dir.path().join("b.log");
        std::os::unix::fs::symlink(&elsewhere, rotated(&path)).unwrap();
        let mut log = BoundedFile::open(&path, 2, Start::Append).unwrap();
        log.write(b"12345");
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
        assert_eq!(std::fs::read(rotated(&path)).unwrap(), b"34");
        let fifo = dir.path().join("fifo.log");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(BoundedFile::open(&fifo, 8, Start::Append).is_err());
    }

    #[test]
    fn a_log_whose_directory_went_drops_what_follows() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("layer");
        std::fs::create_dir(&sub).unwrap();
        let path = sub.join("a.log");
        let mut log = BoundedFile::open(&path, 4, Start::Fresh).unwrap();
        std::fs::remove_dir_all(&sub).unwrap();
        log.write(b"0123456789");
        log.write(b"more");
        assert!(log.file.is_none());
        assert!(!sub.exists());
    }
}
