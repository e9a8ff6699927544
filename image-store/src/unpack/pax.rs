//! PAX records that matter for a root filesystem: large uid/gid values and extended
//! attributes (`SCHILY.xattr.*`, e.g. `security.capability` on ping-like binaries).

use std::ffi::CString;
use std::io::{self, Read};
#[cfg(target_os = "linux")]
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const XATTR_PREFIX: &str = "SCHILY.xattr.";

#[derive(Default)]
pub struct PaxInfo {
    pub uid: Option<u64>,
    pub gid: Option<u64>,
    pub xattrs: Vec<(CString, Vec<u8>)>,
}

pub fn read<R: Read>(e: &mut tar::Entry<'_, R>) -> io::Result<PaxInfo> {
    let mut info = PaxInfo::default();
    let Some(exts) = e.pax_extensions()? else {
        return Ok(info);
    };
    for ext in exts {
        let ext = ext?;
        let Ok(key) = ext.key() else { continue };
        let number = || ext.value().ok().and_then(|v| v.trim().parse::<u64>().ok());
        match key {
            "uid" => info.uid = number(),
            "gid" => info.gid = number(),
            k => {
                if let Some(name) = k.strip_prefix(XATTR_PREFIX) {
                    if let Ok(c) = CString::new(name) {
                        info.xattrs.push((c, ext.value_bytes().to_vec()));
                    }
                }
            }
        }
    }
    Ok(info)
}

/// Best effort: a file system without xattrs, or an unprivileged unpack (security.*,
/// trusted.*), skips them with a debug line rather than failing the image.
#[cfg(target_os = "linux")]
pub fn apply_xattrs(path: &Path, xattrs: &[(CString, Vec<u8>)]) {
    if xattrs.is_empty() {
        return;
    }
    let Ok(cpath) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    for (name, value) in xattrs {
        // SAFETY: both strings are NUL-terminated and live across the call; `value` is a valid
        // buffer of `value.len()` bytes; lsetxattr does not follow symlinks and only reads them.
        let rc = unsafe {
            libc::lsetxattr(
                cpath.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            tracing::debug!(path = %path.display(), name = ?name, %err, "xattr not applied");
        }
    }
}

/// Not Linux (macOS): its setxattr differs and no such host has tried it; skipped, as above.
#[cfg(not(target_os = "linux"))]
pub fn apply_xattrs(path: &Path, xattrs: &[(CString, Vec<u8>)]) {
    if !xattrs.is_empty() {
        tracing::debug!(path = %path.display(), "xattrs are applied on Linux only: skipped");
    }
}
