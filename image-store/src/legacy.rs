//! Roots that iii 0.25 pulled into its cache, used read-only so an upgrade pulls nothing again.
//!
//! iii 0.25 (`iii-worker`, `cli/rootfs_cache.rs` and `cli/worker_manager/oci.rs`) keeps one
//! flattened root per image reference directly at `~/.iii/cache/<slug>/` (the root itself, no
//! `rootfs/` below it), with the image's config blob saved inside it as `.oci-config.json`,
//! written after the last layer was extracted (in its later versions inside a temporary
//! sibling `.<slug>.tmp-<pid>-<nanos>` renamed into place). It kept no manifest or layer
//! digest, so nothing of the content can be verified. Beside the roots it may leave
//! `<slug>.lock` (its pull lock) and `<slug>.erofs` / `<slug>.sqfs` images; we read neither.
//!
//! The slug: the reference with any `@sha256:...` suffix cut off, trimmed, parsed as an OCI
//! reference and written back whole (`python:3.12` is `docker.io/library/python:3.12`; text
//! that does not parse stays as it is); ASCII letters lowercased, everything but
//! `[a-z0-9._-]` turned into `-`, runs of `-` collapsed, `-`, `.` and `_` trimmed from both
//! ends (`image` when nothing is left); then `-` and the 64-bit FNV-1a hash of that whole
//! text as 16 hex digits. Before it canonicalised references, 0.25 hashed the raw
//! (trimmed) text instead, and it still looks there; so do we.
//!
//! A root found there is used only when every check below holds; any one failing means the
//! root is ignored (logged with the reason) and the image is pulled as if it were not there.
//! Nothing here ever writes into it, renames or removes it, and no link in it is followed:
//! every check reads metadata with `lstat` and descends into real directories only.
//! - The root is a real directory (not a link), owned by our effective uid, not writable by
//!   everyone.
//! - `.oci-config.json` is a regular file (opened without following a link), at most 1 MiB,
//!   JSON, naming this host's architecture (0.25 itself re-pulls on a mismatch or none) and,
//!   if it names one, `linux`. It is the last thing 0.25 writes, so its absence means the
//!   extraction never finished (0.25's own test, `bin/` present, would pass a half-extracted
//!   root of its earlier, non-atomic versions).
//! - `bin` is there (0.25's own completeness test): a directory, or a link that stays inside
//!   the root to one.
//! - No entry at the top of the root is a link that leads out of it (absolute, or with `..`).
//! - Every entry below lies on the root's filesystem (nothing is mounted inside), the tree
//!   holds at most the entry budget of one image, and no file has a hard link outside the
//!   root (each inode's link count equals the names it has inside).
//!
//! Not checked: the content (no digests were kept), file modes and owners below the top,
//! and races with a process of our own uid changing the tree while it is checked (the
//! root is ours; whoever can do that can write our own cache as well).

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use crate::manifest::{host_arch, parse_saved_config, ImageRuntimeConfig};

/// The image config 0.25 saved in each root.
pub const CONFIG_FILE: &str = ".oci-config.json";

/// Bigger than any image config; a larger file is not one.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A 0.25 root that passed every check.
#[derive(Debug, Clone)]
pub struct Found {
    pub rootfs: PathBuf,
    pub config: ImageRuntimeConfig,
}

/// The directory names 0.25 may have used for `oci_ref`, the current rule first.
pub fn slugs(oci_ref: &str) -> Vec<String> {
    let key = oci_ref
        .split_once("@sha256:")
        .map_or(oci_ref, |(left, _)| left)
        .trim();
    let canonical = key
        .parse::<oci_client::Reference>()
        .map(|r| r.whole())
        .unwrap_or_else(|_| key.to_string());
    let mut out = vec![slug_of(&canonical)];
    let raw = slug_of(oci_ref.trim());
    if raw != out[0] {
        out.push(raw);
    }
    out
}

fn slug_of(text: &str) -> String {
    let mut base = String::with_capacity(text.len());
    for c in text.chars() {
        let c = match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '-',
        };
        if !(c == '-' && base.ends_with('-')) {
            base.push(c);
        }
    }
    let base = base.trim_matches(|c| c == '-' || c == '.' || c == '_');
    let base = if base.is_empty() { "image" } else { base };
    format!("{base}-{:016x}", fnv1a64(text.as_bytes()))
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The first root 0.25 left for `oci_ref` under `cache_dir` that passes every check.
pub fn find(cache_dir: &Path, oci_ref: &str, max_entries: u64) -> Option<Found> {
    for slug in slugs(oci_ref) {
        let dir = cache_dir.join(slug);
        if fs::symlink_metadata(&dir).is_err() {
            continue;
        }
        match verify(&dir, max_entries) {
            Ok(config) => {
                tracing::info!(oci_ref, path = %dir.display(), "using the root iii 0.25 pulled (read-only, not pulled again)");
                return Some(Found {
                    rootfs: dir,
                    config,
                });
            }
            Err(reason) => {
                tracing::warn!(oci_ref, path = %dir.display(), %reason, "not using iii 0.25's cached root")
            }
        }
    }
    None
}

/// The cheap part of the checks, for a root already verified in this process: still a
/// directory of ours with its config file.
pub fn still_there(dir: &Path) -> bool {
    top_dir(dir).is_ok()
        && fs::symlink_metadata(dir.join(CONFIG_FILE)).is_ok_and(|m| m.file_type().is_file())
}

/// Every check of the module documentation; the root's run settings when they all hold.
pub fn verify(dir: &Path, max_entries: u64) -> Result<ImageRuntimeConfig, String> {
    let top = top_dir(dir)?;
    let config = read_config(dir)?;
    check_bin(dir)?;
    check_top_links(dir)?;
    check_tree(dir, top.dev(), max_entries)?;
    Ok(config)
}

fn top_dir(dir: &Path) -> Result<fs::Metadata, String> {
    let md = fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if md.file_type().is_symlink() {
        return Err("it is a symbolic link".into());
    }
    if !md.is_dir() {
        return Err("it is not a directory".into());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if md.uid() != euid {
        return Err(format!(
            "it is owned by uid {}, not by us (uid {euid})",
            md.uid()
        ));
    }
    if md.mode() & 0o002 != 0 {
        return Err("it is writable by everyone".into());
    }
    Ok(md)
}

fn read_config(dir: &Path) -> Result<ImageRuntimeConfig, String> {
    let path = dir.join(CONFIG_FILE);
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format!(
                "no {CONFIG_FILE}: iii 0.25 writes it after the last layer, so this extraction did not finish"
            ))
        }
        Err(e) => return Err(format!("{CONFIG_FILE}: {e} (a link is never followed)")),
    };
    let md = file.metadata().map_err(|e| format!("{CONFIG_FILE}: {e}"))?;
    if !md.is_file() {
        return Err(format!("{CONFIG_FILE} is not a regular file"));
    }
    if md.len() > MAX_CONFIG_BYTES {
        return Err(format!("{CONFIG_FILE} is over {MAX_CONFIG_BYTES} bytes"));
    }
    let mut body = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("{CONFIG_FILE}: {e}"))?;
    let saved = parse_saved_config(&body).map_err(|e| format!("{CONFIG_FILE}: {e}"))?;
    let arch = host_arch();
    match saved.architecture.as_deref() {
        Some(a) if a == arch => {}
        other => {
            return Err(format!(
                "{CONFIG_FILE} names architecture {other:?}, this host is {arch}"
            ))
        }
    }
    if let Some(os) = saved.os.as_deref().filter(|os| *os != "linux") {
        return Err(format!("{CONFIG_FILE} names os {os:?}, not linux"));
    }
    Ok(saved.runtime)
}

/// A link target that, read from the top of the root, stays inside it without `..`.
fn inside(target: &Path) -> bool {
    target.components().next().is_some()
        && target
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn check_bin(dir: &Path) -> Result<(), String> {
    let missing = || "no bin/: iii 0.25 counts such a root as unfinished".to_string();
    let md = fs::symlink_metadata(dir.join("bin")).map_err(|_| missing())?;
    if md.is_dir() {
        return Ok(());
    }
    if !md.file_type().is_symlink() {
        return Err(missing());
    }
    let target = fs::read_link(dir.join("bin")).map_err(|e| format!("bin: {e}"))?;
    if !inside(&target) {
        return Err(format!(
            "bin links out of the root (-> {})",
            target.display()
        ));
    }
    // Every step of the target must be a real directory: no second link is followed.
    let mut at = dir.to_path_buf();
    for c in target.components() {
        if let Component::Normal(name) = c {
            at.push(name);
            if !fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
                return Err(format!(
                    "bin links to {}, which is not a directory of the root",
                    target.display()
                ));
            }
        }
    }
    Ok(())
}

fn check_top_links(dir: &Path) -> Result<(), String> {
    let entries = fs::read_dir(dir).map_err(|e| e.to_string())?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let kind = entry.file_type().map_err(|e| e.to_string())?;
        if !kind.is_symlink() {
            continue;
        }
        let target = fs::read_link(entry.path()).map_err(|e| e.to_string())?;
        if !inside(&target) {
            return Err(format!(
                "/{} links out of the root (-> {})",
                entry.file_name().to_string_lossy(),
                target.display()
            ));
        }
    }
    Ok(())
}

fn check_tree(dir: &Path, dev: u64, max_entries: u64) -> Result<(), String> {
    // (dev, ino) of every multiply-linked non-directory: its link count, names seen inside.
    let mut linked: HashMap<(u64, u64), (u64, u64, PathBuf)> = HashMap::new();
    let mut pending = vec![dir.to_path_buf()];
    let mut count: u64 = 0;
    while let Some(at) = pending.pop() {
        let entries = fs::read_dir(&at).map_err(|e| format!("{}: {e}", at.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", at.display()))?;
            let path = entry.path();
            count += 1;
            if count > max_entries {
                return Err(format!("it holds more than {max_entries} entries"));
            }
            let md = fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if md.dev() != dev {
                return Err(format!(
                    "{} is on another filesystem (something is mounted in the root)",
                    path.display()
                ));
            }
            if md.is_dir() {
                pending.push(path);
            } else if md.nlink() > 1 {
                let seen = linked
                    .entry((md.dev(), md.ino()))
                    .or_insert((md.nlink(), 0, path));
                seen.1 += 1;
            }
        }
    }
    if let Some((nlink, names, path)) = linked.values().find(|(n, seen, _)| seen < n) {
        return Err(format!(
            "{} has {nlink} hard links but only {names} inside the root",
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    const PYTHON: &str = "docker.io/library/python:3.12-slim";
    /// Worked out by hand from 0.25's rule (FNV-1a 64 of the canonical reference).
    const PYTHON_SLUG: &str = "docker.io-library-python-3.12-slim-75b604835a32490a";

    #[test]
    fn slugs_follow_iii_025s_rule() {
        assert_eq!(slugs(PYTHON), vec![PYTHON_SLUG.to_string()]);
        assert_eq!(
            slugs("docker.io/library/node:22-slim")[0],
            "docker.io-library-node-22-slim-85049340423905da"
        );
        // Shorthand canonicalises to the same directory; its raw-text slug comes second.
        assert_eq!(
            slugs(" python:3.12-slim "),
            vec![
                PYTHON_SLUG.to_string(),
                "python-3.12-slim-7d2794a436662d45".to_string()
            ]
        );
        // A digest pin is cut off before hashing, but the raw slug keeps it.
        let pinned = format!("{PYTHON}@sha256:{}", "a".repeat(64));
        let s = slugs(&pinned);
        assert_eq!(s[0], PYTHON_SLUG);
        assert!(s[1].starts_with("docker.io-library-python-3.12-slim-sha256-aaa"));
        assert_eq!(
            slugs("iiidev/node")[0],
            slugs("docker.io/iiidev/node:latest")[0]
        );
        // Text that is no reference stays as it is; nothing left is `image`.
        assert!(slugs("::Foo::")[0].starts_with("foo-"));
        assert!(slugs(":::")[0].starts_with("image-"));
        assert_ne!(slugs("a/b:c")[0], slugs("a-b:c")[0]);
    }

    fn config(arch: &str) -> String {
        format!(
            r#"{{"architecture":"{arch}","os":"linux","config":{{"Env":["PATH=/bin","MARK=025"],"Cmd":["python3"],"WorkingDir":"/root"}},"rootfs":{{"type":"layers","diff_ids":[]}}}}"#
        )
    }

    /// A small root in 0.25's layout: merged-usr `bin` link, a hard-linked pair, the config.
    fn root_025(cache: &Path) -> PathBuf {
        let dir = cache.join(PYTHON_SLUG);
        fs::create_dir_all(dir.join("usr/bin")).unwrap();
        fs::create_dir_all(dir.join("etc/alternatives")).unwrap();
        symlink("usr/bin", dir.join("bin")).unwrap();
        fs::write(dir.join("usr/bin/python3"), b"#!").unwrap();
        fs::hard_link(dir.join("usr/bin/python3"), dir.join("usr/bin/python3.12")).unwrap();
        // Absolute links below the top are normal in images (and never followed here).
        symlink("/usr/bin/python3", dir.join("etc/alternatives/python")).unwrap();
        fs::write(dir.join(CONFIG_FILE), config(host_arch())).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn refused(cache: &Path) -> String {
        assert!(find(cache, PYTHON, 1000).is_none());
        verify(&cache.join(PYTHON_SLUG), 1000).unwrap_err()
    }

    #[test]
    fn a_complete_root_is_found_with_the_config_it_kept() {
        let cache = tempfile::tempdir().unwrap();
        assert!(find(cache.path(), PYTHON, 1000).is_none());
        let dir = root_025(cache.path());
        let found = find(cache.path(), PYTHON, 1000).expect("found");
        assert_eq!(found.rootfs, dir);
        assert_eq!(found.config.env, vec!["PATH=/bin", "MARK=025"]);
        assert_eq!(found.config.cmd, vec!["python3"]);
        assert_eq!(found.config.working_dir.as_deref(), Some("/root"));
        assert!(still_there(&dir));
        // A config without run settings gives the defaults.
        fs::write(
            dir.join(CONFIG_FILE),
            format!(r#"{{"architecture":"{}"}}"#, host_arch()),
        )
        .unwrap();
        let found = find(cache.path(), PYTHON, 1000).expect("found");
        assert_eq!(found.config, ImageRuntimeConfig::default());
        // The shorthand reference finds the same directory.
        assert!(find(cache.path(), "python:3.12-slim", 1000).is_some());
    }

    #[test]
    fn an_unfinished_or_foreign_root_is_refused() {
        let cache = tempfile::tempdir().unwrap();
        let dir = root_025(cache.path());
        fs::remove_file(dir.join(CONFIG_FILE)).unwrap();
        assert!(refused(cache.path()).contains("did not finish"));
        assert!(!still_there(&dir));

        fs::write(dir.join(CONFIG_FILE), b"{\"architecture\":").unwrap();
        assert!(refused(cache.path()).contains(CONFIG_FILE));
        let other = if host_arch() == "arm64" {
            "amd64"
        } else {
            "arm64"
        };
        fs::write(dir.join(CONFIG_FILE), config(other)).unwrap();
        assert!(refused(cache.path()).contains("architecture"));
        fs::write(dir.join(CONFIG_FILE), r#"{"os":"linux"}"#).unwrap();
        assert!(refused(cache.path()).contains("architecture"));

        // The config may not be a link, even to a good file.
        fs::write(cache.path().join("good.json"), config(host_arch())).unwrap();
        fs::remove_file(dir.join(CONFIG_FILE)).unwrap();
        symlink(cache.path().join("good.json"), dir.join(CONFIG_FILE)).unwrap();
        assert!(refused(cache.path()).contains("link"));
        fs::remove_file(dir.join(CONFIG_FILE)).unwrap();
        fs::write(dir.join(CONFIG_FILE), config(host_arch())).unwrap();

        fs::remove_file(dir.join("bin")).unwrap();
        assert!(refused(cache.path()).contains("no bin/"));
        symlink("/usr/bin", dir.join("bin")).unwrap();
        assert!(refused(cache.path()).contains("links out"));
        fs::remove_file(dir.join("bin")).unwrap();
        symlink("usr/nothing", dir.join("bin")).unwrap();
        assert!(refused(cache.path()).contains("not a directory"));
        fs::remove_file(dir.join("bin")).unwrap();
        symlink("usr/bin", dir.join("bin")).unwrap();
        assert!(find(cache.path(), PYTHON, 1000).is_some());
    }

    #[test]
    fn links_out_at_the_top_and_hard_links_out_are_refused() {
        let cache = tempfile::tempdir().unwrap();
        let dir = root_025(cache.path());
        symlink("/etc", dir.join("hostetc")).unwrap();
        assert!(refused(cache.path()).contains("/hostetc links out"));
        fs::remove_file(dir.join("hostetc")).unwrap();
        symlink("../../secrets", dir.join("up")).unwrap();
        assert!(refused(cache.path()).contains("/up links out"));
        fs::remove_file(dir.join("up")).unwrap();

        let outside = cache.path().join("secret");
        fs::write(&outside, b"host file").unwrap();
        fs::hard_link(&outside, dir.join("etc/secret")).unwrap();
        assert!(refused(cache.path()).contains("hard links"));
        fs::remove_file(&outside).unwrap();
        assert!(find(cache.path(), PYTHON, 1000).is_some());

        // The entry budget of one image.
        assert!(verify(&dir, 3).unwrap_err().contains("more than 3 entries"));
    }

    #[test]
    fn the_root_must_be_a_directory_of_ours_not_a_link_nor_writable_by_all() {
        let cache = tempfile::tempdir().unwrap();
        let real = root_025(&cache.path().join("elsewhere"));
        symlink(&real, cache.path().join(PYTHON_SLUG)).unwrap();
        assert!(refused(cache.path()).contains("symbolic link"));
        fs::remove_file(cache.path().join(PYTHON_SLUG)).unwrap();

        let dir = root_025(cache.path());
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o757)).unwrap();
        assert!(refused(cache.path()).contains("everyone"));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::lchown(&dir, Some(4242), None).unwrap();
            assert!(refused(cache.path()).contains("owned by uid 4242"));
        }
    }
}
