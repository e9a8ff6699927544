//! `fs::write` and `fs::read`: file contents, raw bytes, read in bounded pages.

use std::fs::{OpenOptions, Permissions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use agent_proto::{FsError, FsErrorCode, FsResponse, CHUNK_SIZE};

use super::{fs_error, os_error};

pub fn write(
    path: &Path,
    data: &[u8],
    mode: u32,
    parents: bool,
    append: bool,
) -> Result<FsResponse, FsError> {
    if let Some(parent) = path.parent() {
        if parents {
            std::fs::create_dir_all(parent).map_err(|e| os_error(parent, e))?;
        } else if !parent.is_dir() {
            return Err(fs_error(
                FsErrorCode::NotFound,
                parent,
                "parent directory does not exist (set parents)",
            ));
        }
    }
    if path.is_dir() {
        return Err(fs_error(FsErrorCode::WrongType, path, "is a directory"));
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .mode(mode & 0o7777)
        .open(path)
        .map_err(|e| os_error(path, e))?;
    file.write_all(data).map_err(|e| os_error(path, e))?;
    // The umask applied at creation; the caller's mode is what counts.
    file.set_permissions(Permissions::from_mode(mode & 0o7777))
        .map_err(|e| os_error(path, e))?;
    Ok(FsResponse::Written {
        bytes_written: data.len() as u64,
        path: path.to_string_lossy().into_owned(),
    })
}

/// Reads at most `max_bytes` from `offset`, handing the bytes to `send` in chunks.
pub fn read(
    path: &Path,
    offset: u64,
    max_bytes: u64,
    mut send: impl FnMut(Vec<u8>),
) -> Result<FsResponse, FsError> {
    let mut file = std::fs::File::open(path).map_err(|e| os_error(path, e))?;
    let meta = file.metadata().map_err(|e| os_error(path, e))?;
    if meta.is_dir() {
        return Err(fs_error(FsErrorCode::WrongType, path, "is a directory"));
    }
    // Pipes and character devices cannot seek: reading them from the start must still work.
    if offset > 0 {
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| os_error(path, e))?;
    }
    let mut left = max_bytes;
    let mut buf = vec![0u8; CHUNK_SIZE];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = file.read(&mut buf[..want]).map_err(|e| os_error(path, e))?;
        if n == 0 {
            break;
        }
        send(buf[..n].to_vec());
        left -= n as u64;
    }
    Ok(FsResponse::Read {
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime: meta.mtime(),
        data: Vec::new(),
    })
}
