//! `fs::mkdir`, `fs::rm`, `fs::chmod`, `fs::mv`: changes to the directory tree. The recursive
//! ones (`rm`, `chmod`) step through directory descriptors, never through a link.

use std::fs::Permissions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use agent_proto::{FsError, FsErrorCode, FsResponse};

use super::at::{self, Kind};
use super::{fs_error, os_error};

pub fn mkdir(path: &Path, mode: u32, parents: bool) -> Result<FsResponse, FsError> {
    if path.is_dir() {
        if parents {
            return Ok(FsResponse::Created { created: false }); // like `mkdir -p`
        }
        return Err(fs_error(FsErrorCode::Exists, path, "already exists"));
    }
    if let Some(parent) = path.parent() {
        if !parents && !parent.is_dir() {
            return Err(fs_error(
                FsErrorCode::NotFound,
                parent,
                "parent directory does not exist (set parents)",
            ));
        }
    }
    std::fs::DirBuilder::new()
        .recursive(parents)
        .mode(0o755)
        .create(path)
        .map_err(|e| os_error(path, e))?;
    std::fs::set_permissions(path, Permissions::from_mode(mode & 0o7777))
        .map_err(|e| os_error(path, e))?;
    Ok(FsResponse::Created { created: true })
}

pub fn rm(path: &Path, recursive: bool) -> Result<FsResponse, FsError> {
    if path.parent().is_none() {
        return Err(fs_error(
            FsErrorCode::BadRequest,
            path,
            "refusing to remove the root",
        ));
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| os_error(path, e))?;
    let result = if !meta.is_dir() {
        std::fs::remove_file(path)
    } else if recursive {
        // std's removal walks by directory descriptors (`openat` with `O_NOFOLLOW`, then
        // `unlinkat` relative to the parent's descriptor) and removes a link itself, never
        // its target: a directory swapped for a link meanwhile cannot lead it out of the tree.
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_dir(path)
    };
    result.map_err(|e| os_error(path, e))?;
    Ok(FsResponse::Removed { removed: true })
}

pub fn chmod(
    path: &Path,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
    recursive: bool,
) -> Result<FsResponse, FsError> {
    let change = Change {
        mode: mode & 0o7777,
        uid,
        gid,
        recursive,
    };
    chmod_with(path, &change, &mut |_| {})
}

/// What `fs::chmod` sets.
struct Change {
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
    recursive: bool,
}

/// [`chmod`], with `hook` run at each entry once it is held and before it is changed (the
/// tests' way to swap it meanwhile).
fn chmod_with(
    path: &Path,
    change: &Change,
    hook: &mut dyn FnMut(&Path),
) -> Result<FsResponse, FsError> {
    // The named path's own last component is never followed (its parents are: the caller
    // named them).
    let held = at::open_path(path).map_err(|e| os_error(path, e))?;
    let mut updated = 0u64;
    change_held(held, path, change, hook, &mut updated)?;
    Ok(FsResponse::Updated { updated })
}

/// Changes what `held` (an `O_PATH` descriptor) refers to, then, for a directory when
/// recursive, each entry, opened from the directory's own descriptor without following:
/// whatever happens to the paths meanwhile, only this tree's inodes change.
fn change_held(
    held: OwnedFd,
    path: &Path,
    change: &Change,
    hook: &mut dyn FnMut(&Path),
    updated: &mut u64,
) -> Result<(), FsError> {
    let fd = held.as_raw_fd();
    let kind = at::kind_of_fd(fd).map_err(|e| os_error(path, e))?;
    if kind == Kind::Symlink {
        return Ok(()); // modes of links mean nothing; never follow them out of the tree
    }
    super::call::current().check()?;
    hook(path);
    if change.uid.is_some() || change.gid.is_some() {
        at::chown_fd(fd, change.uid, change.gid).map_err(|e| os_error(path, e))?;
    }
    at::chmod_fd(fd, change.mode).map_err(|e| os_error(path, e))?;
    *updated += 1;
    if change.recursive && kind == Kind::Dir {
        let dir = at::reopen_dir(fd).map_err(|e| os_error(path, e))?;
        drop(held);
        for entry in dir.entries().map_err(|e| os_error(path, e))? {
            let child = path.join(&entry.name);
            let held = dir
                .open_path(&entry.name)
                .map_err(|e| os_error(&child, e))?;
            change_held(held, &child, change, hook, updated)?;
        }
    }
    Ok(())
}

pub fn mv(src: &Path, dst: &Path, overwrite: bool) -> Result<FsResponse, FsError> {
    std::fs::symlink_metadata(src).map_err(|e| os_error(src, e))?;
    if !overwrite && std::fs::symlink_metadata(dst).is_ok() {
        return Err(fs_error(
            FsErrorCode::Exists,
            dst,
            "already exists (set overwrite)",
        ));
    }
    std::fs::rename(src, dst).map_err(|e| os_error(dst, e))?;
    Ok(FsResponse::Moved { moved: true })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn a_directory_swapped_for_a_link_mid_chmod_changes_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        std::fs::set_permissions(&secret, Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(outside.path(), Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f"), "x").unwrap();
        let change = Change {
            mode: 0o700,
            uid: None,
            gid: None,
            recursive: true,
        };
        // Held, then swapped for a link out of the tree before it is changed and entered.
        let mut swapped = false;
        let answer = chmod_with(&root, &change, &mut |path| {
            if path == root.join("sub") {
                std::fs::rename(root.join("sub"), root.join("moved")).unwrap();
                symlink(outside.path(), root.join("sub")).unwrap();
                swapped = true;
            }
        })
        .unwrap();
        assert!(swapped);
        assert_eq!(
            mode_of(outside.path()),
            0o755,
            "the link's target untouched"
        );
        assert_eq!(mode_of(&secret), 0o644);
        assert_eq!(
            mode_of(&root.join("moved")),
            0o700,
            "the held directory changed"
        );
        assert_eq!(mode_of(&root.join("moved/f")), 0o700);
        assert!(
            matches!(answer, FsResponse::Updated { updated: 3 }),
            "{answer:?}"
        );
    }

    #[test]
    fn recursive_chmod_and_rm_never_follow_a_link_inside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        std::fs::set_permissions(outside.path(), Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(root.join("a")).unwrap();
        symlink(outside.path(), root.join("a/out")).unwrap();
        let updated = chmod(&root, 0o750, None, None, true).unwrap();
        assert!(
            matches!(updated, FsResponse::Updated { updated: 2 }),
            "{updated:?}"
        );
        assert_eq!(mode_of(outside.path()), 0o755);
        // A link named as the path itself is not followed either.
        let named = chmod(&root.join("a/out"), 0o700, None, None, true).unwrap();
        assert!(
            matches!(named, FsResponse::Updated { updated: 0 }),
            "{named:?}"
        );
        assert_eq!(mode_of(outside.path()), 0o755);
        rm(&root, true).unwrap();
        assert!(!root.exists());
        assert!(
            outside.path().join("keep").exists(),
            "rm removed the link, not its target"
        );
    }
}
