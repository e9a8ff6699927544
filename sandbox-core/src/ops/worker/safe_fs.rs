//! Writing files on the host without following links: for directories that something other
//! than the adapter could have written (a worker's state directory, whose `logs/` older
//! versions let the guest write). Only the last component is guarded (`O_NOFOLLOW`); the
//! directories above it are the adapter's own. Opens are non-blocking so a FIFO planted where
//! a file should be cannot hang the adapter. (The worker's log itself is opened the same way
//! by the `bounded-log` crate.)

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::libc;

/// Flags every open here adds: no link followed, no blocking open, never a controlling tty.
const GUARDED: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

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

#[cfg(test)]
mod tests {
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
    fn a_directory_stays_and_a_fifo_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(remove_unless_regular(&sub).is_err(), "a directory stays");
        let fifo = dir.path().join("fifo");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
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
