//! A directory a root adapter hands to a sandbox for writing (a worker's `/state`) belongs on
//! disk to the sandbox's subordinate ids, not to the ids it sees.
//!
//! The image and the layer are shown through idmapped mounts: on disk they keep the ids the
//! sandbox sees, so a file its root makes there is host uid 0 on disk. That is harmless for
//! the layer (a disk image, mounted only inside the launcher) but not for `/state`, a plain
//! host directory: a setuid file the guest leaves there is a setuid-root file of the host.
//! So `/state` is bound as it is, without an idmap, and owned by the sandbox's range: what the
//! guest writes there is owned by `base + k` on the host, an id nobody on the host holds.
//!
//! A `/state` written before this (its files owned by the ids seen inside) is moved into the
//! range once, at the next start: every entry's ids are shifted by `base`, walked through
//! directory descriptors without following a link (no guest runs meanwhile), and the
//! directory itself last, which marks the move done. `chown` clears the set-id bits of the
//! files it moves; nothing else changes.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{fchownat, Gid, Uid};

use crate::userns::IdMap;

/// Directories deeper than this below the handed directory are refused (each level holds a
/// descriptor while it is walked).
pub const MAX_DEPTH: usize = 256;

/// Gives `dir` (a directory the adapter made) to the sandbox ids of `map`; a no-op when it
/// already belongs to them. An error leaves the move to be finished by the next call.
pub fn give_to_range(dir: &Path, map: IdMap) -> io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(io::Error::other(format!("{} has no parent", dir.display())));
    };
    let parent = Dir::open(parent, directory_flags(), Mode::empty())?;
    let stat = fstatat(Some(parent.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if !is_directory(stat.st_mode) {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    if stat.st_uid == map.uid_base && stat.st_gid == map.gid_base {
        return Ok(());
    }
    let top = Dir::openat(
        Some(parent.as_raw_fd()),
        name,
        directory_flags(),
        Mode::empty(),
    )?;
    shift_children(top, map, 1)?;
    shift(parent.as_raw_fd(), name, map)
}

fn directory_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn is_directory(mode: u32) -> bool {
    SFlag::from_bits_truncate(mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// The id an on-disk id `id` seen inside becomes: moved into the range when it is one the
/// sandbox sees, left alone otherwise (already moved, or never the sandbox's).
fn moved(id: u32, base: u32, count: u32) -> u32 {
    if id < count {
        base + id
    } else {
        id
    }
}

/// Moves the ids of the entry `name` of `parent` (a link itself, never its target).
fn shift(parent: RawFd, name: &OsStr, map: IdMap) -> io::Result<()> {
    let stat = fstatat(Some(parent), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let uid = moved(stat.st_uid, map.uid_base, map.count);
    let gid = moved(stat.st_gid, map.gid_base, map.count);
    if (uid, gid) == (stat.st_uid, stat.st_gid) {
        return Ok(());
    }
    fchownat(
        Some(parent),
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// Moves everything below the open directory `dir`, children before their directory.
fn shift_children(mut dir: Dir, map: IdMap, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "directories nest deeper than {MAX_DEPTH} levels"
        )));
    }
    let names: Vec<CString> = dir
        .iter()
        .map(|entry| entry.map(|e| e.file_name().to_owned()))
        .collect::<Result<_, _>>()?;
    let fd = dir.as_raw_fd();
    for name in names.iter().map(CString::as_c_str).filter(|n| !is_dot(n)) {
        let name = OsStr::from_bytes(name.to_bytes());
        let stat = fstatat(Some(fd), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
        if is_directory(stat.st_mode) {
            let child = Dir::openat(Some(fd), name, directory_flags(), Mode::empty())?;
            shift_children(child, map, depth + 1)?;
        }
        shift(fd, name, map)?;
    }
    Ok(())
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const MAP: IdMap = IdMap {
        uid_base: 300_000,
        gid_base: 400_000,
        count: 65536,
        subordinate: None,
    };

    fn owner(path: &Path) -> (u32, u32) {
        let meta = std::fs::symlink_metadata(path).unwrap();
        (meta.uid(), meta.gid())
    }

    #[test]
    fn ids_seen_inside_move_into_the_range_and_moved_ones_stay() {
        assert_eq!(moved(0, 300_000, 65536), 300_000);
        assert_eq!(moved(65535, 300_000, 65536), 365_535);
        assert_eq!(moved(300_000, 300_000, 65536), 300_000);
        assert_eq!(moved(65536, 300_000, 65536), 65536);
    }

    /// Needs root (chown to arbitrary ids): says so and checks nothing else without it.
    #[test]
    fn an_old_state_tree_moves_once_and_no_link_is_followed() {
        if !nix::unistd::geteuid().is_root() {
            println!("NOT RUN here: moving ids needs root");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let outside = base.path().join("outside");
        std::fs::write(&outside, "host file").unwrap();
        let state = base.path().join("data");
        std::fs::create_dir_all(state.join("deep/er")).unwrap();
        std::fs::write(state.join("deep/er/f"), "x").unwrap();
        std::fs::write(state.join("suid"), "x").unwrap();
        std::fs::set_permissions(state.join("suid"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::os::unix::fs::symlink(&outside, state.join("link")).unwrap();
        std::os::unix::fs::chown(state.join("deep/er/f"), Some(1000), Some(1000)).unwrap();

        give_to_range(&state, MAP).unwrap();
        assert_eq!(owner(&state), (300_000, 400_000));
        assert_eq!(owner(&state.join("deep/er")), (300_000, 400_000));
        assert_eq!(owner(&state.join("deep/er/f")), (301_000, 401_000));
        assert_eq!(
            owner(&state.join("link")),
            (300_000, 400_000),
            "the link itself"
        );
        assert_eq!(owner(&outside), (0, 0), "the link's target is not touched");
        let mode = std::fs::metadata(state.join("suid")).unwrap().mode();
        assert_eq!(mode & 0o6000, 0, "moving drops the set-id bits");

        // Done once: a file the sandbox's root left later (host uid base) stays as it is,
        // and so does anything else, even an entry with a small id.
        std::os::unix::fs::chown(state.join("deep/er/f"), Some(7), Some(7)).unwrap();
        give_to_range(&state, MAP).unwrap();
        assert_eq!(owner(&state.join("deep/er/f")), (7, 7));
    }

    #[test]
    fn too_deep_a_tree_is_refused_and_a_file_is_no_directory() {
        if !nix::unistd::geteuid().is_root() {
            println!("NOT RUN here: moving ids needs root");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let state = base.path().join("data");
        let mut deep = state.clone();
        for _ in 0..=MAX_DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let e = give_to_range(&state, MAP).unwrap_err();
        assert!(e.to_string().contains("deeper than"), "{e}");
        assert_eq!(owner(&state).0, 0, "not marked as moved");
        std::fs::write(base.path().join("file"), "x").unwrap();
        assert!(give_to_range(&base.path().join("file"), MAP).is_err());
    }
}
