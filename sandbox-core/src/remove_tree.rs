//! Removing a directory a guest wrote into (a sandbox's layer, a worker's state) without
//! ever following a link out of it.
//!
//! `std::fs::remove_dir_all` already refuses to follow symlinks, but it stops at the first
//! directory it may not read. Guests leave such directories: overlayfs itself makes its
//! `work/work` mode 000, and any program may `chmod 000` a directory of its own. When the
//! adapter runs as an ordinary user (its uid is the guest's root) those directories are the
//! adapter's own, so it gives itself access back and tries again: every step is taken
//! relative to a directory descriptor it already holds, with `O_NOFOLLOW`, so a link planted
//! where a directory was is never followed and never changed.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fchmodat, fstatat, FchmodatFlags, Mode, SFlag};

/// Removes `path` and everything under it; a missing `path` is not an error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(e);
            };
            let parent = Dir::open(parent, directory_flags(), Mode::empty())?;
            unlock(parent.as_raw_fd(), name)?;
            std::fs::remove_dir_all(path)
        }
        Err(e) => Err(e),
    }
}

fn directory_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Gives the owner rwx on the directory `name` of `parent` and on every directory below it;
/// anything that is not a real directory is left alone.
fn unlock(parent: RawFd, name: &OsStr) -> io::Result<()> {
    let stat = fstatat(Some(parent), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFDIR {
        return Ok(());
    }
    // glibc does AT_SYMLINK_NOFOLLOW through an O_PATH descriptor: a link is refused, never
    // followed. Not ours (EPERM): removal will say so.
    let _ = fchmodat(
        Some(parent),
        name,
        Mode::from_bits_truncate(0o700 | (stat.st_mode & 0o7777)),
        FchmodatFlags::NoFollowSymlink,
    );
    let mut dir = Dir::openat(Some(parent), name, directory_flags(), Mode::empty())?;
    let children: Vec<_> = dir
        .iter()
        .flatten()
        .filter(|entry| matches!(entry.file_type(), Some(Type::Directory) | None))
        .map(|entry| entry.file_name().to_owned())
        .filter(|name| name.to_bytes() != b"." && name.to_bytes() != b"..")
        .collect();
    for child in children {
        unlock(dir.as_raw_fd(), OsStr::from_bytes(child.to_bytes()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn locked_directories_are_removed_and_links_out_are_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let outside = base.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "host file").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o500)).unwrap();
        let tree = base.path().join("layer");
        std::fs::create_dir_all(tree.join("work/work/deep")).unwrap();
        std::fs::write(tree.join("work/work/deep/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("work/link")).unwrap();
        for dir in ["work/work/deep", "work/work"] {
            std::fs::set_permissions(tree.join(dir), std::fs::Permissions::from_mode(0o000))
                .unwrap();
        }
        // Root removes anything anyway: check the unlocking itself (what an ordinary user's
        // removal relies on), then the removal.
        let parent = Dir::open(base.path(), directory_flags(), Mode::empty()).unwrap();
        unlock(parent.as_raw_fd(), OsStr::new("layer")).unwrap();
        for dir in ["work/work/deep", "work/work"] {
            let mode = std::fs::metadata(tree.join(dir))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o700, 0o700, "{dir}");
        }
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        // The link's target kept its mode and content.
        let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o500);
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "host file"
        );
        remove_tree(&tree).unwrap();
    }
}
