//! `fs::write` and `fs::read`: file contents, raw bytes, read in bounded pages. Both take
//! regular files only: a FIFO, a socket or a device is S212 (a FIFO would block the open
//! until a peer comes, a device may never end), and every open is non-blocking, so the
//! check happens before anything can wait.

use std::fs::Permissions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use agent_proto::{FsError, FsErrorCode, FsResponse, CHUNK_SIZE};

use super::{at, call, fs_error, os_error};

const NOT_REGULAR: &str = "not a regular file (a FIFO, socket or device): use exec for it";

/// S212 for what is not a regular file.
fn wrong_kind(path: &Path, meta: &std::fs::Metadata) -> Option<FsError> {
    if meta.is_dir() {
        Some(fs_error(FsErrorCode::WrongType, path, "is a directory"))
    } else if !meta.is_file() {
        Some(fs_error(FsErrorCode::WrongType, path, NOT_REGULAR))
    } else {
        None
    }
}

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
    if let Some(wrong) = std::fs::metadata(path)
        .ok()
        .and_then(|m| wrong_kind(path, &m))
    {
        return Err(wrong);
    }
    let flags = libc::O_WRONLY
        | libc::O_CREAT
        | if append {
            libc::O_APPEND
        } else {
            libc::O_TRUNC
        };
    let mut file = at::open_nonblocking(path, flags, mode & 0o7777).map_err(|e| {
        match e.raw_os_error() {
            // A FIFO that appeared meanwhile, with no reader.
            Some(libc::ENXIO) => fs_error(FsErrorCode::WrongType, path, NOT_REGULAR),
            _ => os_error(path, e),
        }
    })?;
    let meta = file.metadata().map_err(|e| os_error(path, e))?;
    if let Some(wrong) = wrong_kind(path, &meta) {
        return Err(wrong);
    }
    file.write_all(data).map_err(|e| os_error(path, e))?;
    // The umask applied at creation; the caller's mode is what counts.
    file.set_permissions(Permissions::from_mode(mode & 0o7777))
        .map_err(|e| os_error(path, e))?;
    Ok(FsResponse::Written {
        bytes_written: data.len() as u64,
        path: path.to_string_lossy().into_owned(),
    })
}

/// Reads at most `max_bytes` from `offset`, handing the bytes to `send` in chunks (which
/// stops the read with its error).
pub fn read(
    path: &Path,
    offset: u64,
    max_bytes: u64,
    mut send: impl FnMut(Vec<u8>) -> Result<(), FsError>,
) -> Result<FsResponse, FsError> {
    let mut file = at::open_nonblocking(path, libc::O_RDONLY, 0).map_err(|e| os_error(path, e))?;
    let meta = file.metadata().map_err(|e| os_error(path, e))?;
    if let Some(wrong) = wrong_kind(path, &meta) {
        return Err(wrong);
    }
    if offset > 0 {
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| os_error(path, e))?;
    }
    let cancel = call::current();
    let mut left = max_bytes;
    let mut buf = vec![0u8; CHUNK_SIZE];
    while left > 0 {
        cancel.check()?;
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = match file.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(os_error(path, e)),
        };
        send(buf[..n].to_vec())?;
        left -= n as u64;
    }
    Ok(FsResponse::Read {
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime: meta.mtime(),
        data: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(result: Result<FsResponse, FsError>) -> &'static str {
        result.err().map_or("ok", |e| e.code.s_code())
    }

    #[test]
    fn fifos_and_devices_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c_fifo` is NUL-terminated.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        // Without a peer, a blocking open of either end would wait for ever.
        assert_eq!(code(read(&fifo, 0, 10, |_| Ok(()))), "S212");
        assert_eq!(code(write(&fifo, b"x", 0o644, false, false)), "S212");
        assert_eq!(code(write(&fifo, b"x", 0o644, false, true)), "S212");
        let null = Path::new("/dev/null");
        assert_eq!(code(read(null, 0, 10, |_| Ok(()))), "S212");
        assert_eq!(code(write(null, b"x", 0o644, false, false)), "S212");
        assert_eq!(code(read(dir.path(), 0, 10, |_| Ok(()))), "S212");
        // Regular files still work, through a link too.
        let file = dir.path().join("f");
        assert_eq!(code(write(&file, b"hello", 0o640, false, false)), "ok");
        std::os::unix::fs::symlink(&file, dir.path().join("link")).unwrap();
        let mut got = Vec::new();
        let answer = read(&dir.path().join("link"), 1, 3, |chunk| {
            got.extend(chunk);
            Ok(())
        });
        assert!(matches!(
            answer,
            Ok(FsResponse::Read {
                size: 5,
                mode: 0o640,
                ..
            })
        ));
        assert_eq!(got, b"ell");
    }
}
