//! Safe path resolution inside the root being unpacked.
//!
//! Why our own and not `tar::Entry::unpack_in` or a canonicalize-and-check: layers legitimately
//! write *through* symlinked directories of lower layers (`/lib -> usr/lib` on merged-usr
//! distributions), and absolute symlinks must mean "the image's root", not the host's. So every
//! symlink met on the way is followed the way a chroot would follow it: absolute targets restart
//! at the root and `..` never climbs above it. The final component is never followed (we replace
//! it). The tree is private to this unpack (a temporary directory nobody else writes), so the
//! lstat-then-act sequence has no concurrent writer to race with; `openat2(RESOLVE_IN_ROOT)`
//! would do the same on Linux >= 5.6 only, and not on macOS.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// How many symlinks one resolution may follow, as Linux's MAXSYMLINKS.
const MAX_SYMLINKS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("entry {0:?} climbs out of the root with '..'")]
    DotDot(String),
    #[error("entry {0:?} has an empty name")]
    Empty(String),
    #[error("too many symlinks resolving {0:?}")]
    Loop(String),
    #[error("a parent of {path:?} is not a directory ({at:?})")]
    NotDir { path: String, at: PathBuf },
    #[error("{0:?}: {1}")]
    Io(PathBuf, #[source] io::Error),
}

/// Splits an archive path into normal components. `..` anywhere is refused (no legitimate
/// layer needs it; Docker and containerd clamp it, we refuse the layer as a clear signal).
pub fn split(name: &Path) -> Result<Vec<OsString>, ResolveError> {
    let mut out = Vec::new();
    for c in name.components() {
        match c {
            Component::Normal(p) => out.push(p.to_os_string()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err(ResolveError::DotDot(name.display().to_string())),
        }
    }
    Ok(out)
}

/// Resolves the directory that will hold an entry: follows symlinks within `root`, creates
/// missing directories when `create` is set (as tar does for implicit parents), and returns the
/// host path of that directory, always inside `root`.
pub fn resolve_dir(root: &Path, comps: &[OsString], create: bool) -> Result<PathBuf, ResolveError> {
    let display = || {
        comps
            .iter()
            .map(|c| c.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let mut stack: Vec<OsString> = Vec::new();
    let mut pending: Vec<OsString> = comps.iter().rev().cloned().collect();
    let mut links = 0;
    while let Some(c) = pending.pop() {
        let bytes = c.as_bytes();
        if bytes.is_empty() || bytes == b"." {
            continue;
        }
        if bytes == b".." {
            stack.pop();
            continue;
        }
        let here = join(root, &stack).join(&c);
        match std::fs::symlink_metadata(&here) {
            Ok(md) if md.file_type().is_symlink() => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(ResolveError::Loop(display()));
                }
                let target = std::fs::read_link(&here).map_err(|e| ResolveError::Io(here, e))?;
                if target.as_os_str().as_bytes().starts_with(b"/") {
                    stack.clear();
                }
                for part in target.as_os_str().as_bytes().split(|b| *b == b'/').rev() {
                    pending.push(OsStr::from_bytes(part).to_os_string());
                }
            }
            Ok(md) if md.is_dir() => stack.push(c),
            Ok(_) => {
                return Err(ResolveError::NotDir {
                    path: display(),
                    at: here,
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                std::fs::create_dir(&here).map_err(|e| ResolveError::Io(here.clone(), e))?;
                stack.push(c);
            }
            Err(e) => return Err(ResolveError::Io(here, e)),
        }
    }
    Ok(join(root, &stack))
}

fn join(root: &Path, stack: &[OsString]) -> PathBuf {
    let mut p = root.to_path_buf();
    p.extend(stack);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn dotdot_is_refused_and_root_prefix_dropped() {
        assert!(matches!(
            split(Path::new("a/../../etc")),
            Err(ResolveError::DotDot(_))
        ));
        assert_eq!(split(Path::new("/./a//b")).unwrap(), vec!["a", "b"]);
    }

    #[test]
    fn symlinks_resolve_as_in_a_chroot() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("/", root.join("abs")).unwrap();
        symlink("../../../../..", root.join("up")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        let r = |p: &str| resolve_dir(&root, &split(Path::new(p)).unwrap(), true);
        assert_eq!(r("lib").unwrap(), root.join("usr/lib"));
        assert_eq!(r("abs/etc").unwrap(), root.join("etc"));
        assert_eq!(r("up/tmp").unwrap(), root.join("tmp"));
        assert!(root.join("tmp").is_dir() && !tmp.path().join("tmp").exists());
        assert!(matches!(r("loop/x"), Err(ResolveError::Loop(_))));
        std::fs::write(root.join("file"), b"").unwrap();
        assert!(matches!(r("file/x"), Err(ResolveError::NotDir { .. })));
    }
}
