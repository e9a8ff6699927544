//! The spec's extra mounts, made on the host side inside the guest's root (the merged
//! overlay), in the runner's private mount namespace, before the VM starts. libkrun's
//! virtio-fs server looks names up with `openat`, which crosses mount points, and keys its
//! inodes by (inode, device, mount id): so the guest sees every one of these mounts through
//! the single root share.
//!
//! The order mirrors bwrap's: mounts and links in the spec's order, then read-only tmpfs
//! directories remounted read-only last, once the entries below them exist.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use crate::spec::GuestMount;

/// Why a mount could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount point {path}: {reason}")]
    Refused { path: String, reason: &'static str },
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: io::Error,
    },
    #[error("a mount path holds a NUL byte")]
    Nul,
}

pub(crate) fn io_error(what: &'static str, path: &Path, source: io::Error) -> MountError {
    MountError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// Where the root overlay's bounded filesystem is, for [`GuestMount::LayerDir`].
#[derive(Debug, Clone, Copy)]
pub enum Layer<'a> {
    /// Mounted by the runner here.
    OnHost(&'a Path),
    /// The guest's own disk: the guest init binds its directories.
    InGuest,
    /// None (an unbounded overlay, or none).
    None,
}

/// Makes every mount of `mounts` inside `root`. The caller is in a private mount namespace.
pub fn apply(root: &Path, mounts: &[GuestMount], layer: Layer) -> Result<(), MountError> {
    let mut read_only_dirs = Vec::new();
    for mount in mounts {
        match mount {
            GuestMount::Bind {
                host_path,
                guest_path,
                read_only,
            } => {
                let target = mount_point(root, guest_path, host_path.is_dir())?;
                bind(host_path, &target, *read_only)?;
            }
            GuestMount::Tmpfs {
                guest_path,
                read_only,
            } => {
                let target = mount_point(root, guest_path, true)?;
                tmpfs(&target, None)?;
                if *read_only {
                    read_only_dirs.push(target);
                }
            }
            GuestMount::Symlink { target, guest_path } => {
                symlink(root, guest_path, target)?;
            }
            GuestMount::LayerDir { name, guest_path } => match layer {
                Layer::OnHost(layer) => {
                    let source = layer_dir(layer, name)?;
                    let target = mount_point(root, guest_path, true)?;
                    bind(&source, &target, false)?;
                }
                // The guest init makes it on its disk and binds it over its own root.
                Layer::InGuest => {}
                Layer::None => {
                    return Err(MountError::Refused {
                        path: guest_path.clone(),
                        reason: "a layer directory needs a bounded root overlay",
                    })
                }
            },
        }
    }
    // Not recursive: the binds below keep their own flags.
    for dir in read_only_dirs {
        remount_read_only(&dir)?;
    }
    Ok(())
}

/// The directory `name` of the layer's filesystem, made if missing. Only the runner sees
/// the layer's top (the guest sees what is inside `upper` and inside this directory), but
/// what is there must still be a directory, never a link.
fn layer_dir(layer: &Path, name: &str) -> Result<PathBuf, MountError> {
    let dir = layer.join(name);
    match std::fs::create_dir(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io_error("make", &dir, e))
        }
        _ => {}
    }
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.file_type().is_dir() => Ok(dir),
        Ok(_) => Err(MountError::Refused {
            path: dir.display().to_string(),
            reason: "not a directory",
        }),
        Err(e) => Err(io_error("inspect", &dir, e)),
    }
}

/// `guest` (absolute, plain names) inside `root`, with every missing directory on the way
/// created. An existing symbolic link on the way is refused: it would be followed on the
/// host, possibly out of the root.
fn inside_root(root: &Path, guest: &str) -> Result<PathBuf, MountError> {
    let mut path = root.to_path_buf();
    let names: Vec<_> = Path::new(guest)
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return Err(MountError::Refused {
            path: guest.to_owned(),
            reason: "is the root itself",
        });
    };
    for name in parents {
        path.push(name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(MountError::Refused {
                    path: guest.to_owned(),
                    reason: "a parent on the way is a symbolic link or not a directory",
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&path)
                    .map_err(|e| io_error("create the directory", &path, e))?;
            }
            Err(e) => return Err(io_error("inspect", &path, e)),
        }
    }
    path.push(last);
    Ok(path)
}

/// Creates (when missing) the directory or file to mount over at `guest` inside `root`.
fn mount_point(root: &Path, guest: &str, directory: bool) -> Result<PathBuf, MountError> {
    let path = inside_root(root, guest)?;
    let refused = |reason| MountError::Refused {
        path: guest.to_owned(),
        reason,
    };
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(refused("is a symbolic link")),
        Ok(meta) if meta.is_dir() == directory => Ok(path),
        Ok(_) if directory => Err(refused("exists and is not a directory")),
        Ok(_) => Err(refused("exists and is a directory, the source is a file")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if directory {
                std::fs::create_dir(&path)
                    .map_err(|e| io_error("create the directory", &path, e))?;
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&path)
                    .map_err(|e| io_error("create the file", &path, e))?;
            }
            Ok(path)
        }
        Err(e) => Err(io_error("inspect", &path, e)),
    }
}

/// A symbolic link at `guest`; one left there by an earlier boot of a persistent layer is
/// replaced, anything else in the way is refused.
fn symlink(root: &Path, guest: &str, target: &str) -> Result<(), MountError> {
    let path = inside_root(root, guest)?;
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            if std::fs::read_link(&path).is_ok_and(|old| old == Path::new(target)) {
                return Ok(());
            }
            std::fs::remove_file(&path).map_err(|e| io_error("replace the link", &path, e))?;
        }
        Ok(_) => {
            return Err(MountError::Refused {
                path: guest.to_owned(),
                reason: "exists and is not a symbolic link",
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("inspect", &path, e)),
    }
    std::os::unix::fs::symlink(target, &path).map_err(|e| io_error("create the link", &path, e))
}

fn c_path(path: &Path) -> Result<CString, MountError> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| MountError::Nul)
}

fn mount_call(
    what: &'static str,
    source: Option<&CString>,
    target: &Path,
    fstype: Option<&std::ffi::CStr>,
    flags: libc::c_ulong,
    data: Option<&std::ffi::CStr>,
) -> Result<(), MountError> {
    let c_target = c_path(target)?;
    let ptr = |s: Option<&std::ffi::CStr>| s.map_or(std::ptr::null(), std::ffi::CStr::as_ptr);
    // SAFETY: every non-null pointer is a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            ptr(source.map(CString::as_c_str)),
            c_target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    };
    if ret != 0 {
        return Err(io_error(what, target, io::Error::last_os_error()));
    }
    Ok(())
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
    let c_source = c_path(source)?;
    mount_call(
        "bind-mount onto",
        Some(&c_source),
        target,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )?;
    if read_only {
        remount_read_only(target)?;
    }
    Ok(())
}

/// A tmpfs (nosuid, nodev, mode 0755) on `target`: `size_mib` large when given, else the
/// kernel's default size.
pub(crate) fn tmpfs(target: &Path, size_mib: Option<u32>) -> Result<(), MountError> {
    let tmpfs = c"tmpfs";
    let options = match size_mib {
        Some(size) => format!("size={size}m,mode=0755"),
        None => "mode=0755".to_string(),
    };
    let options = CString::new(options).map_err(|_| MountError::Nul)?;
    mount_call(
        "mount a tmpfs on",
        Some(&CString::from(tmpfs)),
        target,
        Some(tmpfs),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&options),
    )
}

/// Makes the mount at `target` read-only, keeping the flags it has (a bind remount may not
/// drop nosuid/nodev/noexec the source mount carries).
fn remount_read_only(target: &Path) -> Result<(), MountError> {
    let kept = mount_flags(target)?;
    mount_call(
        "remount read-only",
        None,
        target,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | kept,
        None,
    )
}

/// The per-mount flags of the mount at `target`, as mount(2) flags.
fn mount_flags(target: &Path) -> Result<libc::c_ulong, MountError> {
    let c_target = c_path(target)?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a statvfs we own.
    if unsafe { libc::statvfs(c_target.as_ptr(), &mut stats) } != 0 {
        return Err(io_error(
            "inspect the mount at",
            target,
            io::Error::last_os_error(),
        ));
    }
    let pairs = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(pairs
        .iter()
        .filter(|(st, _)| stats.f_flag & st != 0)
        .fold(0, |flags, (_, ms)| flags | ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_created_to_match_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let dir_point = mount_point(dir.path(), "/a/b/state", true).unwrap();
        assert!(dir_point.is_dir());
        let file_point = mount_point(dir.path(), "/a/b/app.txt", false).unwrap();
        assert!(file_point.is_file());
        // A persistent layer keeps them: the second boot reuses them.
        assert_eq!(
            mount_point(dir.path(), "/a/b/state", true).unwrap(),
            dir_point
        );
        assert!(matches!(
            mount_point(dir.path(), "/a/b/app.txt", true),
            Err(MountError::Refused { .. })
        ));
        assert!(matches!(
            mount_point(dir.path(), "/a/b/state", false),
            Err(MountError::Refused { .. })
        ));
    }

    #[test]
    fn symbolic_links_on_the_way_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("escape")).unwrap();
        assert!(matches!(
            mount_point(dir.path(), "/escape/x", true),
            Err(MountError::Refused { .. })
        ));
        assert!(matches!(
            mount_point(dir.path(), "/escape", true),
            Err(MountError::Refused { .. })
        ));
        assert!(!outside.path().join("x").exists());
    }

    #[test]
    fn symlinks_are_made_and_replaced_but_never_over_other_files() {
        let dir = tempfile::tempdir().unwrap();
        symlink(dir.path(), "/w/link", "/etc/passwd").unwrap();
        let link = dir.path().join("w/link");
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/etc/passwd"));
        symlink(dir.path(), "/w/link", "../other").unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("../other"));
        std::fs::write(dir.path().join("w/file"), b"x").unwrap();
        assert!(matches!(
            symlink(dir.path(), "/w/file", "x"),
            Err(MountError::Refused { .. })
        ));
    }
}
