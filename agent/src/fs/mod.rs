//! Filesystem operations on the guest's own root: the agent runs inside the sandbox, so
//! its `/` is the sandbox's root and a path cannot name anything of the host. One file
//! per group of SPEC `fs::*` rows; errors map to S210..S219 here. Every call runs on a
//! thread of its own within its deadline (`call`), its large buffers within one budget
//! (`budget`).

pub(crate) mod at;
mod budget;
mod call;
mod entry;
mod file;
mod grep;
mod pattern;
mod sed;
mod template;
mod tree;
mod walk;
mod wire;

use std::io;
use std::path::{Path, PathBuf};

use agent_proto::{FsError, FsErrorCode, FsReply, FsRequest, FsResponse, Message, FS_CALL_TIMEOUT};

use crate::log::log;
use crate::outbox::Outbox;

pub use budget::settle_allocator;

/// Starts one request on a thread of its own; its reply (a read sends its `Data` frames
/// first) comes by `FS_CALL_TIMEOUT` at the latest. A call the agent cannot take now is
/// answered S216 at once.
pub fn start(id: u32, request: FsRequest, body: Vec<u8>, outbox: &Outbox) {
    let started = call::spawn(id, outbox, FS_CALL_TIMEOUT, move |outbox| {
        match run(id, request, body, outbox) {
            Ok(r) => FsReply::Ok(r),
            Err(e) => FsReply::Err(e),
        }
    });
    if let Err(refused) = started {
        log!("fs request {id} refused: {refused}");
        let error = FsError::new(FsErrorCode::Io, refused.to_string());
        outbox.send(id, Message::FsReply(FsReply::Err(error)));
    }
}

fn run(id: u32, request: FsRequest, body: Vec<u8>, outbox: &Outbox) -> Result<FsResponse, FsError> {
    match request {
        FsRequest::Ls { path } => entry::ls(&guest_path(&path)?),
        FsRequest::Stat { path } => entry::stat(&guest_path(&path)?),
        FsRequest::Mkdir {
            path,
            mode,
            parents,
        } => tree::mkdir(&guest_path(&path)?, mode, parents),
        FsRequest::Write {
            path,
            mode,
            parents,
            append,
            ..
        } => file::write(&guest_path(&path)?, &body, mode, parents, append),
        FsRequest::Read {
            path,
            offset,
            max_bytes,
        } => file::read(&guest_path(&path)?, offset, max_bytes, |chunk| {
            // Once the deadline has answered, nothing more goes out for this request.
            call::current().check()?;
            outbox.send(
                id,
                Message::Data {
                    data: chunk,
                    end: false,
                },
            );
            Ok(())
        }),
        FsRequest::Rm { path, recursive } => tree::rm(&guest_path(&path)?, recursive),
        FsRequest::Chmod {
            path,
            mode,
            uid,
            gid,
            recursive,
        } => tree::chmod(&guest_path(&path)?, mode, uid, gid, recursive),
        FsRequest::Mv {
            src,
            dst,
            overwrite,
        } => tree::mv(&guest_path(&src)?, &guest_path(&dst)?, overwrite),
        FsRequest::Grep {
            path,
            pattern,
            recursive,
            ignore_case,
            include_glob,
            exclude_glob,
            max_matches,
            max_line_bytes,
        } => grep::grep(
            &guest_path(&path)?,
            &grep::Query {
                pattern: &pattern,
                recursive,
                ignore_case,
                include_glob: &include_glob,
                exclude_glob: &exclude_glob,
                max_matches,
                max_line_bytes,
            },
        ),
        FsRequest::Sed {
            target,
            pattern,
            replacement,
            regex,
            first_only,
            ignore_case,
            recursive,
            include_glob,
            exclude_glob,
        } => {
            if let agent_proto::fs::SedTarget::Tree(root) = &target {
                guest_path(root)?;
            }
            sed::sed(
                &target,
                &sed::Query {
                    pattern: &pattern,
                    replacement: &replacement,
                    regex,
                    first_only,
                    ignore_case,
                    recursive,
                    include_glob: &include_glob,
                    exclude_glob: &exclude_glob,
                },
            )
        }
    }
}

/// Paths must be absolute guest paths; relative ones would depend on the agent's cwd.
fn guest_path(path: &str) -> Result<PathBuf, FsError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(FsError::new(
            FsErrorCode::BadRequest,
            format!("{path:?}: expected an absolute path"),
        ));
    }
    Ok(PathBuf::from(path))
}

/// Maps an OS error on `path` to the SPEC's fs codes.
fn os_error(path: &Path, err: io::Error) -> FsError {
    let code = match err.raw_os_error() {
        Some(libc::ENOENT) => FsErrorCode::NotFound,
        Some(libc::EEXIST) => FsErrorCode::Exists,
        Some(libc::ENOTEMPTY) => FsErrorCode::NotEmpty,
        Some(libc::ENOTDIR) | Some(libc::EISDIR) => FsErrorCode::WrongType,
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => FsErrorCode::Permission,
        Some(libc::EXDEV) => FsErrorCode::Unsupported,
        _ => FsErrorCode::Io,
    };
    FsError::new(code, format!("{}: {err}", path.display()))
}

fn fs_error(code: FsErrorCode, path: &Path, what: &str) -> FsError {
    FsError::new(code, format!("{}: {what}", path.display()))
}
