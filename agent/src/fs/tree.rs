//! `fs::mkdir`, `fs::rm`, `fs::chmod`, `fs::mv`: changes to the directory tree.

use std::fs::Permissions;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use agent_proto::{FsError, FsErrorCode, FsResponse};

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
    let mut updated = 0u64;
    change(path, mode, uid, gid, recursive, &mut updated)?;
    Ok(FsResponse::Updated { updated })
}

fn change(
    path: &Path,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
    recursive: bool,
    updated: &mut u64,
) -> Result<(), FsError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| os_error(path, e))?;
    if meta.file_type().is_symlink() {
        return Ok(()); // modes of links mean nothing; never follow them out of the tree
    }
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::lchown(path, uid, gid).map_err(|e| os_error(path, e))?;
    }
    std::fs::set_permissions(path, Permissions::from_mode(mode & 0o7777))
        .map_err(|e| os_error(path, e))?;
    *updated += 1;
    if recursive && meta.is_dir() {
        for item in std::fs::read_dir(path).map_err(|e| os_error(path, e))? {
            let item = item.map_err(|e| os_error(path, e))?;
            change(&item.path(), mode, uid, gid, true, updated)?;
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
