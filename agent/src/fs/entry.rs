//! `fs::ls` and `fs::stat`: directory entries in the SPEC's shape (no symlink followed). A
//! listing travels in one reply frame: a directory with more entries than fit is S216 as
//! soon as that is known, so its memory stays within one frame's worth.

use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use agent_proto::{FsEntry, FsError, FsErrorCode, FsResponse};

use super::wire::{json_str_len, REPLY_BUDGET};
use super::{call, fs_error, os_error};

/// JSON of one entry besides its name.
const ENTRY_OVERHEAD: usize = 100;

pub fn ls(path: &Path) -> Result<FsResponse, FsError> {
    let meta = std::fs::metadata(path).map_err(|e| os_error(path, e))?;
    if !meta.is_dir() {
        return Err(fs_error(FsErrorCode::WrongType, path, "not a directory"));
    }
    let mut entries = Vec::new();
    let mut size = 0;
    let cancel = call::current();
    for item in std::fs::read_dir(path).map_err(|e| os_error(path, e))? {
        let item = item.map_err(|e| os_error(path, e))?;
        cancel.check()?;
        let name = item.file_name().to_string_lossy().into_owned();
        size += json_str_len(&name) + ENTRY_OVERHEAD;
        if size > REPLY_BUDGET {
            return Err(fs_error(
                FsErrorCode::Io,
                path,
                &format!(
                    "more entries than one reply holds (over {}): list it with exec",
                    entries.len()
                ),
            ));
        }
        // An entry removed while we list is simply not listed.
        let Ok(meta) = item.metadata() else { continue };
        entries.push(entry(name, &meta));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_too_large_for_one_reply_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let long = "n".repeat(200);
        let fits = REPLY_BUDGET / (json_str_len(&long) + 3 + ENTRY_OVERHEAD);
        for i in 0..fits / 2 {
            std::fs::write(dir.path().join(format!("{long}{i}")), "").unwrap();
        }
        let Ok(FsResponse::Entries { entries }) = ls(dir.path()) else {
            panic!("lists what fits")
        };
        assert_eq!(entries.len(), fits / 2);
        for i in fits / 2..fits * 2 {
            std::fs::write(dir.path().join(format!("{long}{i}")), "").unwrap();
        }
        let refused = ls(dir.path()).unwrap_err();
        assert_eq!(refused.code.s_code(), "S216", "{refused}");
        let reply = agent_proto::Message::FsReply(agent_proto::FsReply::Ok(FsResponse::Entries {
            entries: (0..fits)
                .map(|i| FsEntry {
                    name: format!("{long}{i}"),
                    is_dir: true,
                    is_symlink: true,
                    size: u64::MAX,
                    mode: 0o7777,
                    mtime: i64::MIN,
                })
                .collect(),
        }));
        assert!(reply.into_frame(1).is_ok(), "what is listed fits one frame");
    }
}
