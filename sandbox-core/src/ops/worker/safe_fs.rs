//! Opening files on the host without following links: for directories that something other
//! than the adapter could have written (a worker's state directory, whose `logs/` older
//! versions let the guest write). Only the last component is guarded (`O_NOFOLLOW`); the
//! directories above it are the adapter's own. Every open also refuses anything but a regular
//! file, checked on the opened descriptor (`fstat`), and is non-blocking so a FIFO planted
//! where a file should be cannot hang the adapter.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::libc;

/// Flags every open here adds: no link followed, no blocking open, never a controlling tty.
const GUARDED: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Opens `path` to append to it, creating it (mode 0600) if missing. A link or any other
/// non-regular file there is refused, and left as it is.
pub fn open_append(path: &Path) -> io::Result<File> {
    let opened = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(GUARDED)
        .open(path);
    regular(path, opened)
}

/// Opens `path` to read it; `None` if it does not exist. A link or any other non-regular file
/// there is refused.
pub fn open_read(path: &Path) -> io::Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(GUARDED)
        .open(path);
    match opened {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        opened => regular(path, opened).map(Some),
    }
}

/// Creates `path` anew (mode 0600) and writes `content` to it. Whatever already has that name
/// is unlinked first (a link is removed, never followed); the create then fails rather than
/// reuse anything that appeared meanwhile (`O_CREAT | O_EXCL | O_NOFOLLOW`).
pub fn write_new(path: &Path, content: &[u8]) -> io::Result<()> {
    remove_entry(path)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(GUARDED)
        .open(path)?;
    io::Write::write_all(&mut file, content)?;
    file.sync_data()
}

/// Removes what is at `path` if it is not a regular file (a link itself, not its target);
/// whether it did. A directory there is an error.
pub fn remove_unless_regular(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => Ok(false),
        Ok(_) => std::fs::remove_file(path).map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Unlinks `path` (never its target), if anything is there.
fn remove_entry(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn regular(path: &Path, opened: io::Result<File>) -> io::Result<File> {
    let file = opened.map_err(|e| match e.raw_os_error() {
        // What O_NOFOLLOW answers for a link.
        Some(libc::ELOOP) => not_regular(path, "a symbolic link"),
        // What a non-blocking open for writing answers for a FIFO nobody reads.
        Some(libc::ENXIO) => not_regular(path, "a FIFO or device"),
        _ => e,
    })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(path, "not a regular file"));
    }
    Ok(file)
}

fn not_regular(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is {what}: refused", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::process::Command;

    use super::*;

    /// A directory with `target` (a file whose content must never change) and `link`, a
    /// symlink to it.
    fn link_to_target() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"canary").unwrap();
        let link = dir.path().join("link");
        symlink(&target, &link).unwrap();
        (dir, target, link)
    }

    #[test]
    fn a_symlink_where_the_log_should_be_is_refused_and_its_target_is_unchanged() {
        let (_dir, target, link) = link_to_target();
        let before = std::fs::metadata(&target).unwrap().modified().unwrap();
        let error = open_append(&link).unwrap_err();
        assert!(error.to_string().contains("symbolic link"), "{error}");
        assert!(open_read(&link).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"canary");
        assert_eq!(
            std::fs::metadata(&target).unwrap().modified().unwrap(),
            before
        );
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        // A dangling link is refused too: nothing is created at its target.
        let dangling = link.with_file_name("dangling");
        symlink(link.with_file_name("nowhere"), &dangling).unwrap();
        assert!(open_append(&dangling).is_err());
        assert!(!link.with_file_name("nowhere").exists());
    }

    #[test]
    fn a_new_file_replaces_a_link_without_writing_through_it() {
        let (_dir, target, link) = link_to_target();
        write_new(&link, b"fresh").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"canary");
        let meta = std::fs::symlink_metadata(&link).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&link).unwrap(), b"fresh");
    }

    #[test]
    fn appends_create_owner_only_files_and_keep_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("worker.log");
        assert!(open_read(&log).unwrap().is_none());
        open_append(&log).unwrap().write_all(b"one ").unwrap();
        open_append(&log).unwrap().write_all(b"two").unwrap();
        let mode = std::fs::metadata(&log).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut read = String::new();
        open_read(&log)
            .unwrap()
            .unwrap()
            .read_to_string(&mut read)
            .unwrap();
        assert_eq!(read, "one two");
    }

    #[test]
    fn directories_and_fifos_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(open_read(&sub).is_err());
        assert!(open_append(&sub).is_err());
        assert!(remove_unless_regular(&sub).is_err(), "a directory stays");
        let fifo = dir.path().join("fifo");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        assert!(
            open_append(&fifo).is_err(),
            "no reader: refused, not blocked"
        );
        assert!(open_read(&fifo).is_err());
        assert!(remove_unless_regular(&fifo).unwrap());
        assert!(std::fs::symlink_metadata(&fifo).is_err());
    }

    #[test]
    fn only_what_is_not_a_regular_file_is_removed() {
        let (_dir, target, link) = link_to_target();
        assert!(!remove_unless_regular(&target).unwrap());
        assert!(remove_unless_regular(&link).unwrap());
        assert!(std::fs::symlink_metadata(&link).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"canary");
        assert!(!remove_unless_regular(&link).unwrap(), "nothing left");
    }
}
