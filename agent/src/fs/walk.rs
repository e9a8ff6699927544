//! The file walk of `fs::grep` / `fs::sed`: regular files under a root, in a stable order.
//! Links found while walking are never followed (no loops, never out of the tree through a
//! link); the root itself is followed, like `grep -r` treats its operand. Directories on a
//! pseudo filesystem (proc, sysfs, ...) are skipped: their files can block or never end.
//! Entries that vanish or cannot be read while walking are skipped, as `grep -rs` does.

use std::ffi::CString;
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use agent_proto::{FsError, FsErrorCode};

use super::pattern::Filter;
use super::{fs_error, os_error};

/// Calls `visit` with each regular file under `root`: `root` itself when it is a file (no
/// filter applies to a file named explicitly), else each directory's files in name order,
/// then its subdirectories (only its direct files unless `recursive`). `visit` may stop it.
pub fn files(
    root: &Path,
    recursive: bool,
    filter: &Filter,
    visit: &mut dyn FnMut(&Path) -> ControlFlow<()>,
) -> Result<(), FsError> {
    let meta = std::fs::metadata(root).map_err(|e| os_error(root, e))?;
    if meta.is_file() {
        let _ = visit(root);
        return Ok(());
    }
    if !meta.is_dir() {
        return Err(fs_error(
            FsErrorCode::WrongType,
            root,
            "not a regular file or directory",
        ));
    }
    // The root must be readable; below it, unreadable directories are skipped.
    std::fs::read_dir(root).map_err(|e| os_error(root, e))?;
    let mut pending = vec![(root.to_path_buf(), PathBuf::new(), meta.dev())];
    while let Some((dir, relative, dev)) = pending.pop() {
        let Ok(listing) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = listing.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for entry in entries {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            let rel = relative.join(entry.file_name());
            if kind.is_file() {
                if filter.keeps_file(&rel) && visit(&path).is_break() {
                    return Ok(());
                }
            } else if kind.is_dir() && recursive && filter.enters_dir(&rel) {
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                if meta.dev() == dev || !is_pseudo_fs(&path) {
                    subdirs.push((path, rel, meta.dev()));
                }
            }
            // Links, sockets, FIFOs and devices are never read.
        }
        pending.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// Kernel filesystems whose files are not data: reading them can block (/proc/kmsg) or be
/// endless. Checked only where the walk crosses onto another device.
fn is_pseudo_fs(path: &Path) -> bool {
    const PSEUDO: &[i64] = &[
        0x9fa0,      // proc
        0x6265_6572, // sysfs
        0x1cd1,      // devpts
        0x6462_6720, // debugfs
        0x7472_6163, // tracefs
        0x7363_6673, // securityfs
        0x6367_7270, // cgroup2
        0x0027_e0eb, // cgroup
        0x6e73_6673, // nsfs
        0xcafe_4a11, // bpf
    ];
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: statfs is plain old data; all-zero bytes are a valid value.
    let mut info: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `info` a valid, writable statfs that
    // outlives the call.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut info) } != 0 {
        return true; // cannot tell: stay out
    }
    #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between targets
    PSEUDO.contains(&(info.f_type as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn walk(root: &Path, recursive: bool, include: &[&str], exclude: &[&str]) -> Vec<String> {
        let owned = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let filter = Filter::new(&owned(include), &owned(exclude)).unwrap();
        let mut seen = Vec::new();
        files(root, recursive, &filter, &mut |p| {
            let shown = p.strip_prefix(root).unwrap_or(p);
            seen.push(shown.to_string_lossy().into_owned());
            ControlFlow::Continue(())
        })
        .unwrap();
        seen
    }

    #[test]
    fn walks_in_order_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "x").unwrap();
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::create_dir_all(root.join("node_modules")).unwrap();
        for f in ["z.txt", "a.rs", "b/x.rs", "b/c/y.txt", "node_modules/m.rs"] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        symlink(outside.path(), root.join("b/out")).unwrap();
        symlink(root, root.join("b/c/loop")).unwrap();
        symlink(root.join("a.rs"), root.join("alias.rs")).unwrap();

        assert_eq!(
            walk(root, true, &[], &[]),
            ["a.rs", "z.txt", "b/x.rs", "b/c/y.txt", "node_modules/m.rs"]
        );
        assert_eq!(walk(root, false, &[], &[]), ["a.rs", "z.txt"]);
        assert_eq!(
            walk(root, true, &["*.rs"], &["node_modules"]),
            ["a.rs", "b/x.rs"]
        );
        assert_eq!(walk(root, true, &["b/**"], &["*.rs"]), ["b/c/y.txt"]);
        // A file named explicitly is visited whatever the globs say; the root link is followed.
        assert_eq!(walk(&root.join("z.txt"), true, &["*.rs"], &[]), [""]);
        assert_eq!(walk(&root.join("b/out"), true, &[], &[]), ["secret.txt"]);
    }

    #[test]
    fn visit_can_stop_and_errors_name_the_root() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a", "b", "c"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        let filter = Filter::new(&[], &[]).unwrap();
        let mut count = 0;
        files(dir.path(), true, &filter, &mut |_| {
            count += 1;
            ControlFlow::Break(())
        })
        .unwrap();
        assert_eq!(count, 1);
        let missing = files(&dir.path().join("nope"), true, &filter, &mut |_| {
            ControlFlow::Continue(())
        });
        assert_eq!(missing.unwrap_err().code, FsErrorCode::NotFound);
        let fifo = files(Path::new("/dev/null"), true, &filter, &mut |_| {
            ControlFlow::Continue(())
        });
        assert_eq!(fifo.unwrap_err().code, FsErrorCode::WrongType);
    }

    #[test]
    fn proc_is_a_pseudo_filesystem_and_tmp_is_not() {
        assert!(is_pseudo_fs(Path::new("/proc")));
        assert!(!is_pseudo_fs(&std::env::temp_dir()));
    }
}
