//! Loads libkrunfw from the path the probe chose, so that libkrun's later
//! `dlopen("libkrunfw.so.5")` finds that copy (glibc matches loaded libraries by soname)
//! instead of searching the system path only.

use std::ffi::{CStr, CString};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum FirmwareError {
    #[error("cannot load {path}: {reason}")]
    Load { path: String, reason: String },
}

/// Loads the library for the rest of the process's life (it is never closed).
pub fn preload(path: &Path) -> Result<(), FirmwareError> {
    let shown = path.display().to_string();
    let c_path =
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| FirmwareError::Load {
            path: shown.clone(),
            reason: "path holds a NUL byte".into(),
        })?;
    // SAFETY: `c_path` is a valid NUL-terminated string; the handle is deliberately leaked
    // so the library stays mapped while libkrun uses it.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a valid C string owned by libc, read at once.
        let reason = unsafe {
            let err = libc::dlerror();
            if err.is_null() {
                "unknown dlopen error".to_owned()
            } else {
                CStr::from_ptr(err).to_string_lossy().into_owned()
            }
        };
        return Err(FirmwareError::Load {
            path: shown,
            reason,
        });
    }
    Ok(())
}
