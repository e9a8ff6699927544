//! The file walk of `fs::grep` / `fs::sed`: regular files under a root, in a stable order.
//! Links found while walking are never followed (no loops, never out of the tree through a
//! link, not even one swapped in for a directory mid-walk: each step is opened from the
//! directory descriptor already held, `O_NOFOLLOW`); the root itself is followed, like
//! `grep -r` treats its operand. Directories on a
//! pseudo filesystem (proc, sysfs, ...) are skipped: their files can block or never end.
//! Entries that vanish or cannot be read while walking are skipped, as `grep -rs` does.

use std::ffi::OsStr;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use agent_proto::{FsError, FsErrorCode};

use super::at::{Dir, Kind};
use super::call;
use super::pattern::Filter;
use super::{fs_error, os_error};

/// Where a walk starts.
pub enum Start {
    /// `root` is a regular file (through links: the caller named it).
    File,
    /// `root` is a directory, held open: everything below is resolved from this descriptor.
    Dir(Dir),
}

/// What `root` is: a file, or a directory opened for the walk (links followed, as `grep -r`
/// follows its operand).
pub fn start(root: &Path) -> Result<Start, FsError> {
    let meta = std::fs::metadata(root).map_err(|e| os_error(root, e))?;
    if meta.is_file() {
        return Ok(Start::File);
    }
    if !meta.is_dir() {
        return Err(fs_error(
            FsErrorCode::WrongType,
            root,
            "not a regular file or directory",
        ));
    }
    // The root must be readable; below it, unreadable directories are skipped.
    Dir::open(root)
        .map(Start::Dir)
        .map_err(|e| os_error(root, e))
}

/// One regular file met by a walk, named relative to the directory that holds it.
pub struct Found<'a> {
    /// The root joined with `rel`, as replies show it.
    pub path: &'a Path,
    /// The path below the root.
    pub rel: &'a Path,
    /// The directory holding the file, as the walk opened it.
    pub dir: &'a Dir,
    pub name: &'a OsStr,
}

/// A directory still to walk: a name inside a directory already open.
struct Pending {
    parent: Rc<Dir>,
    name: std::ffi::OsString,
    rel: PathBuf,
    parent_dev: u64,
}

/// Calls `visit` with each regular file under the directory `root_dir` (opened from `root`
/// by [`start`]): each directory's files in name order, then its subdirectories (only its
/// direct files unless `recursive`). Each subdirectory is opened from its parent's
/// descriptor with `O_NOFOLLOW`: one swapped for a link meanwhile is skipped, never entered.
/// `visit` may stop the walk; the call's deadline ends it with S216.
pub fn files(
    root_dir: &Dir,
    root: &Path,
    recursive: bool,
    filter: &Filter,
    visit: &mut dyn FnMut(&Found) -> ControlFlow<()>,
) -> Result<(), FsError> {
    let first = root_dir.try_clone().map_err(|e| os_error(root, e))?;
    let root_dev = first.dev().unwrap_or(0);
    let mut next = Some((Rc::new(first), PathBuf::new(), root_dev));
    let mut pending: Vec<Pending> = Vec::new();
    let cancel = call::current();
    loop {
        cancel.check()?;
        let (dir, relative, dev) = match next.take() {
            Some(start) => start,
            None => {
                let Some(sub) = pending.pop() else {
                    return Ok(());
                };
                let Ok(dir) = sub.parent.sub(&sub.name) else {
                    continue; // vanished, unreadable, or no longer a directory
                };
                let dev = dir.dev().unwrap_or(sub.parent_dev);
                if dev != sub.parent_dev && is_pseudo_fs(&dir) {
                    continue;
                }
                (Rc::new(dir), sub.rel, dev)
            }
        };
        let Ok(mut entries) = dir.entries() else {
            continue;
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let mut subdirs = Vec::new();
        for entry in entries {
            let rel = relative.join(&entry.name);
            match entry.kind {
                Kind::File if filter.keeps_file(&rel) => {
                    cancel.check()?;
                    let path = root.join(&rel);
                    let found = Found {
                        path: &path,
                        rel: &rel,
                        dir: &dir,
                        name: &entry.name,
                    };
                    if visit(&found).is_break() {
                        return Ok(());
                    }
                }
                Kind::Dir if recursive && filter.enters_dir(&rel) => subdirs.push(Pending {
                    parent: Rc::clone(&dir),
                    name: entry.name,
                    rel,
                    parent_dev: dev,
                }),
                // Links, sockets, FIFOs and devices are never read.
                _ => {}
            }
        }
        pending.extend(subdirs.into_iter().rev());
    }
}

/// Kernel filesystems whose files are not data: reading them can block (/proc/kmsg) or be
/// endless. Checked only where the walk crosses onto another device.
fn is_pseudo_fs(dir: &Dir) -> bool {
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
    // Cannot tell: stay out.
    dir.fs_type().map_or(true, |kind| PSEUDO.contains(&kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn walk(root: &Path, recursive: bool, include: &[&str], exclude: &[&str]) -> Vec<String> {
        walk_with(root, recursive, include, exclude, &mut |_| {})
    }

    /// A walk whose `hook` runs at each file, before the walk goes on.
    fn walk_with(
        root: &Path,
        recursive: bool,
        include: &[&str],
        exclude: &[&str],
        hook: &mut dyn FnMut(&Path),
    ) -> Vec<String> {
        let owned = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let filter = Filter::new(&owned(include), &owned(exclude)).unwrap();
        let Start::Dir(dir) = start(root).unwrap() else {
            return vec![String::new()]; // a file: the walk is that file
        };
        let mut seen = Vec::new();
        files(&dir, root, recursive, &filter, &mut |found| {
            let shown = found.path.strip_prefix(root).unwrap_or(found.path);
            assert_eq!(shown, found.rel);
            seen.push(shown.to_string_lossy().into_owned());
            hook(found.path);
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
    fn a_directory_swapped_for_a_link_mid_walk_is_never_entered() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "x").unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), "x").unwrap();
        std::fs::write(root.join("sub/inside.txt"), "x").unwrap();
        // Listed as a directory, then swapped for a link out of the tree before the walk
        // descends into it (files come first, so the hook runs at `a.txt`).
        let mut swapped = false;
        let seen = walk_with(root, true, &[], &[], &mut |path| {
            if !swapped && path.ends_with("a.txt") {
                std::fs::rename(root.join("sub"), root.join("moved")).unwrap();
                symlink(outside.path(), root.join("sub")).unwrap();
                swapped = true;
            }
        });
        assert!(swapped);
        assert_eq!(seen, ["a.txt"], "nothing through the swapped-in link");
    }

    #[test]
    fn visit_can_stop_and_errors_name_the_root() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a", "b", "c"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        let filter = Filter::new(&[], &[]).unwrap();
        let mut count = 0;
        let Start::Dir(opened) = start(dir.path()).unwrap() else {
            panic!("a directory")
        };
        files(&opened, dir.path(), true, &filter, &mut |_| {
            count += 1;
            ControlFlow::Break(())
        })
        .unwrap();
        assert_eq!(count, 1);
        let missing = start(&dir.path().join("nope"));
        assert_eq!(missing.err().unwrap().code, FsErrorCode::NotFound);
        let fifo = start(Path::new("/dev/null"));
        assert_eq!(fifo.err().unwrap().code, FsErrorCode::WrongType);
        assert!(matches!(start(&dir.path().join("a")), Ok(Start::File)));
    }

    #[test]
    fn proc_is_a_pseudo_filesystem_and_tmp_is_not() {
        assert!(is_pseudo_fs(&Dir::open(Path::new("/proc")).unwrap()));
        assert!(!is_pseudo_fs(&Dir::open(&std::env::temp_dir()).unwrap()));
    }
}
