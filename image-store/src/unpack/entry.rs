//! Writes one tar entry into the root: files, directories, symlinks, hard links, devices,
//! replacing whatever a lower layer left at that name (type changes), keeping modes and owners.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tar::EntryType;

/// What the entry's header says about ownership and permissions.
pub struct Meta {
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
    /// Whether to apply owners (only root may chown to arbitrary ids).
    pub chown: bool,
}

/// Removes whatever is at `path` unless it is a directory and `keep_dir` is set.
/// Returns true when a directory was kept.
pub fn clear(path: &Path, keep_dir: bool) -> io::Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => {
            if keep_dir {
                return Ok(true);
            }
            fs::remove_dir_all(path)?;
        }
        Ok(_) => fs::remove_file(path)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(false)
}

pub fn write_dir(path: &Path, meta: &Meta) -> io::Result<()> {
    if !clear(path, true)? {
        fs::create_dir(path)?;
    }
    set_owner(path, meta)?;
    fs::set_permissions(path, fs::Permissions::from_mode(meta.mode & 0o7777))
}

pub fn write_file(path: &Path, data: &mut dyn Read, meta: &Meta) -> io::Result<u64> {
    clear(path, false)?;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let n = io::copy(data, &mut f)?;
    // chown first: it clears setuid/setgid bits, which chmod then sets back.
    set_owner(path, meta)?;
    f.set_permissions(fs::Permissions::from_mode(meta.mode & 0o7777))?;
    set_mtime(&f, meta.mtime)?;
    Ok(n)
}

pub fn write_symlink(path: &Path, target: &Path, meta: &Meta) -> io::Result<()> {
    clear(path, false)?;
    std::os::unix::fs::symlink(target, path)?;
    set_owner(path, meta)?;
    set_path_mtime(path, meta.mtime)
}

/// Sets the mtime (and atime) of `path` itself, never of what a symlink points to.
pub fn set_path_mtime(path: &Path, mtime: u64) -> io::Result<()> {
    let c = cstring(path)?;
    let secs = libc::time_t::try_from(mtime).unwrap_or(libc::time_t::MAX);
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: `c` is a valid NUL-terminated path and `times` two valid timespecs, both alive
    // for the call; AT_SYMLINK_NOFOLLOW makes it act on a symlink itself.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `source` was resolved inside the root by the caller; linkat without AT_SYMLINK_FOLLOW
/// links a symlink itself, never what it points to.
pub fn write_hardlink(path: &Path, source: &Path) -> io::Result<()> {
    let md = fs::symlink_metadata(source)?;
    if md.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "hard link to a directory",
        ));
    }
    if source == path {
        return Ok(());
    }
    clear(path, false)?;
    fs::hard_link(source, path)
}

#[cfg(target_os = "linux")]
pub fn write_special(path: &Path, kind: EntryType, dev: (u32, u32), meta: &Meta) -> io::Result<()> {
    clear(path, false)?;
    let fmt = match kind {
        EntryType::Char => libc::S_IFCHR,
        EntryType::Block => libc::S_IFBLK,
        _ => libc::S_IFIFO,
    };
    let c = cstring(path)?;
    let devnum = libc::makedev(dev.0, dev.1);
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call; mknod only reads it.
    let rc = unsafe { libc::mknod(c.as_ptr(), fmt | (meta.mode & 0o7777), devnum) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    set_owner(path, meta)
}

/// Not Linux (macOS): mknod's types differ there and no such host has tried it.
#[cfg(not(target_os = "linux"))]
pub fn write_special(path: &Path, _: EntryType, _: (u32, u32), _: &Meta) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "{}: device nodes and fifos are unpacked on Linux only",
            path.display()
        ),
    ))
}

fn set_owner(path: &Path, meta: &Meta) -> io::Result<()> {
    if !meta.chown {
        return Ok(());
    }
    let (Ok(uid), Ok(gid)) = (u32::try_from(meta.uid), u32::try_from(meta.gid)) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "uid/gid out of range",
        ));
    };
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

fn set_mtime(f: &File, mtime: u64) -> io::Result<()> {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(mtime);
    f.set_modified(t)
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// Opaque directory: removes everything below `dir` that this layer did not itself write.
pub fn clear_opaque(dir: &Path, written: &std::collections::HashSet<PathBuf>) -> io::Result<()> {
    for child in fs::read_dir(dir)? {
        let path = child?.path();
        if written.contains(&path) {
            let md = fs::symlink_metadata(&path)?;
            if md.is_dir() {
                clear_opaque(&path, written)?;
            }
        } else {
            clear(&path, false)?;
        }
    }
    Ok(())
}
