//! `fs::ls` and `fs::stat`: directory entries in the SPEC's shape (no symlink followed).

use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use agent_proto::{FsEntry, FsError, FsErrorCode, FsResponse};

use super::{fs_error, os_error};

pub fn ls(path: &Path) -> Result<FsResponse, FsError> {
    let meta = std::fs::metadata(path).map_err(|e| os_error(path, e))?;
    if !meta.is_dir() {
        return Err(fs_error(FsErrorCode::WrongType, path, "not a directory"));
    }
    let mut entries = Vec::new();
    for item in std::fs::read_dir(path).map_err(|e| os_error(path, e))? {
        let item = item.map_err(|e| os_error(path, e))?;
        // An entry removed while we list is simply not listed.
        let Ok(meta) = item.metadata() else { continue };
        entries.push(entry(
            item.file_name().to_string_lossy().into_owned(),
            &meta,
        ));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(FsResponse::Entries { entries })
}

pub fn stat(path: &Path) -> Result<FsResponse, FsError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| os_error(path, e))?;
    let name = path
        .file_name()
        .map_or_else(|| "/".to_string(), |n| n.to_string_lossy().into_owned());
    Ok(FsResponse::Entry {
        entry: entry(name, &meta),
    })
}

pub fn entry(name: String, meta: &Metadata) -> FsEntry {
    FsEntry {
        name,
        is_dir: meta.is_dir(),
        is_symlink: meta.file_type().is_symlink(),
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        mtime: meta.mtime(),
    }
}
