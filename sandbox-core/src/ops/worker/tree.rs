//! "A tree minus some files": the mounts that show a host directory read-only in the guest
//! without a few files in it (the Compose file). When nothing is hidden below the directory it
//! is one read-only bind; otherwise a read-only tmpfs stands in for it and every entry but
//! the hidden ones is bound into it, recursing only along the way to a hidden file.
//!
//! Symbolic links inside the tree are recreated as links (resolved inside the guest), never
//! bound: a bind would follow them on the host, out of the allowed roots.

use std::io;
use std::path::{Path, PathBuf};

use crate::backend::{GuestMount, Mount};

/// Mounts showing `host_dir` (canonical) at `guest`, read-only, minus the `hidden` files
/// (canonical paths; those outside `host_dir` are ignored). Entries whose names are not UTF-8
/// are left out of a rebuilt directory.
pub fn read_only_tree(
    host_dir: &Path,
    guest: &str,
    hidden: &[PathBuf],
) -> io::Result<Vec<GuestMount>> {
    let below: Vec<&PathBuf> = hidden
        .iter()
        .filter(|h| h.starts_with(host_dir) && h.as_path() != host_dir)
        .collect();
    let mut mounts = Vec::new();
    add_tree(host_dir, guest, &below, &mut mounts)?;
    Ok(mounts)
}

fn add_tree(
    host: &Path,
    guest: &str,
    hidden: &[&PathBuf],
    mounts: &mut Vec<GuestMount>,
) -> io::Result<()> {
    if !hidden.iter().any(|h| h.starts_with(host)) {
        mounts.push(GuestMount::Bind(Mount {
            host: host.to_path_buf(),
            guest: guest.to_string(),
            read_only: true,
        }));
        return Ok(());
    }
    mounts.push(GuestMount::Tmpfs {
        guest: guest.to_string(),
        read_only: true,
    });
    let mut entries: Vec<_> = std::fs::read_dir(host)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(String::from) else {
            tracing::warn!(path = %path.display(), "left out of a worker's /worker: the name is not UTF-8");
            continue;
        };
        if hidden.iter().any(|h| h.as_path() == path) {
            continue;
        }
        let guest_path = format!("{}/{name}", guest.trim_end_matches('/'));
        if entry.file_type()?.is_symlink() {
            mounts.push(GuestMount::Symlink {
                target: std::fs::read_link(&path)?,
                guest: guest_path,
            });
        } else if entry.file_type()?.is_dir() {
            add_tree(&path, &guest_path, hidden, mounts)?;
        } else {
            mounts.push(GuestMount::Bind(Mount {
                host: path,
                guest: guest_path,
                read_only: true,
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(host: &Path, guest: &str) -> GuestMount {
        GuestMount::Bind(Mount {
            host: host.to_path_buf(),
            guest: guest.into(),
            read_only: true,
        })
    }

    fn tmpfs(guest: &str) -> GuestMount {
        GuestMount::Tmpfs {
            guest: guest.into(),
            read_only: true,
        }
    }

    #[test]
    fn a_tree_without_hidden_files_is_one_read_only_bind() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let elsewhere = PathBuf::from("/nowhere/iii.yaml");
        assert_eq!(
            read_only_tree(&root, "/worker", &[elsewhere]).unwrap(),
            vec![bind(&root, "/worker")]
        );
    }

    #[test]
    fn hidden_files_are_left_out_along_their_path_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(root.join("iii.yaml"), "secret").unwrap();
        std::fs::write(root.join("main.py"), "").unwrap();
        std::fs::write(root.join("a/b/iii.yaml"), "secret").unwrap();
        std::fs::write(root.join("a/b/keep"), "").unwrap();
        std::fs::write(root.join("a/x"), "").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let hidden = [root.join("iii.yaml"), root.join("a/b/iii.yaml")];
        let mounts = read_only_tree(&root, "/worker", &hidden).unwrap();
        assert_eq!(
            mounts,
            vec![
                tmpfs("/worker"),
                tmpfs("/worker/a"),
                tmpfs("/worker/a/b"),
                bind(&root.join("a/b/keep"), "/worker/a/b/keep"),
                bind(&root.join("a/x"), "/worker/a/x"),
                bind(&root.join("lib"), "/worker/lib"),
                GuestMount::Symlink {
                    target: "/etc/passwd".into(),
                    guest: "/worker/link".into()
                },
                bind(&root.join("main.py"), "/worker/main.py"),
            ]
        );
    }
}
