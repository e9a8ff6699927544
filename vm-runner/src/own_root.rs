//! The runner's own root: before the VM starts, the runner moves into a root directory that
//! holds only what libkrun serves the guest from, so that a guest which broke through
//! libkrun finds nothing else of the host there.
//!
//! libkrun's README says the guest and the VMM share one security context, and its virtio-fs
//! server resolves a name the guest sends with `openat(parent, name)`, `..` included: the
//! guest's kernel never sends `..` (its VFS resolves it, and libkrun does not offer the export
//! operations that would ask the server for a parent), but a guest that took over its own
//! kernel could. Above a share's root there is then only this root: a small read-only tmpfs
//! whose directories lead to the served paths and nothing else (as virtiofsd's `pivot_root`
//! into the shared directory, and Firecracker's jailer, do).
//!
//! What the root holds, each bound at its own absolute path (libkrun opens them by the paths
//! of the specification, several of them only once the guest runs: a share's root when the
//! guest mounts it, an agent socket when the guest connects):
//! - the guest's root, its shares and the guest-mounts directory (every mount below each
//!   comes along, as `mount --rbind` does);
//! - the guest's disk image and `/dev/kvm`;
//! - each vsock bridge's socket (the adapter listens) or, where the guest listens, the
//!   directory libkrun makes the socket in;
//! - the console log's directory;
//! - the runner's own descriptors at `/proc/self/fd`: libkrun's virtio-fs server reopens
//!   files through it, and an inherited console is reopened as `/proc/self/fd/N`. Never the
//!   whole `/proc`: its `/proc/PID/root` links would lead a runner to the root of every
//!   process of its user id (pasta, its resolver proxy, an ordinary user's adapter).
//!
//! libkrunfw is loaded before (see `firmware.rs`), libkrun's own library is mapped since the
//! process started, and nothing else is opened by path once the VM runs.
//!
//! Needs a private mount namespace of the runner's own (`overlay::enter_private_namespace`)
//! and a single-threaded process. The runner makes one more mount namespace for this, so
//! that the helpers it forked before (the resolver proxy, which runs `nft`) keep theirs.

use std::fs::{self, File};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::spec::{VmSpec, VsockDirection};

/// Where the new root's tmpfs is mounted while it is filled: every served path is cloned
/// before, so what it covers there does not matter. Every Linux host has it.
const BUILD_DIR: &str = "/tmp";

/// The runner's descriptors (`/proc/self` resolves to the runner when it is cloned), served
/// at the same path.
const OWN_DESCRIPTORS: &str = "/proc/self/fd";

#[derive(Debug, thiserror::Error)]
pub enum OwnRootError {
    #[error("the runner's own root: cannot serve {path}: {source}")]
    Serve { path: PathBuf, source: io::Error },
    #[error("the runner's own root: {what}: {source}")]
    Setup {
        what: &'static str,
        source: io::Error,
    },
}

fn setup(what: &'static str) -> impl FnOnce(nix::Error) -> OwnRootError {
    move |e| OwnRootError::Setup {
        what,
        source: e.into(),
    }
}

/// A path the runner serves from: a directory tree, or one file (device, image, socket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub path: PathBuf,
    pub is_dir: bool,
    /// Served read-only whatever its files' modes say.
    pub read_only: bool,
}

impl Served {
    fn dir(path: &Path) -> Self {
        Served {
            path: path.to_path_buf(),
            is_dir: true,
            read_only: false,
        }
    }
    fn file(path: &Path) -> Self {
        Served {
            path: path.to_path_buf(),
            is_dir: false,
            read_only: false,
        }
    }
    fn read_only_dir(path: &Path) -> Self {
        Served {
            read_only: true,
            ..Served::dir(path)
        }
    }
}

/// Everything the VM of `spec` needs once it runs, outermost first, a path inside another
/// one left out (it comes with it).
pub fn served(spec: &VmSpec) -> Vec<Served> {
    let mut all = vec![Served::dir(&spec.root)];
    all.extend(spec.shares.iter().map(|s| Served::dir(&s.host_path)));
    if let Some(overlay) = &spec.root_overlay {
        if let Some(dir) = overlay.guest_mounts_dir() {
            all.push(Served::dir(&dir));
        }
        if let Some(disk) = &overlay.guest_disk {
            all.push(Served::file(disk));
        }
        // A sandbox's upper directory, for its snapshots only: the adapter copies it through
        // `/proc/PID/root` of this process, which is this root. Read-only: overlayfs alone
        // writes there (a write beside it is undefined), and what it holds the guest wrote
        // through its own root anyway.
        if overlay.ephemeral() {
            all.push(Served::read_only_dir(&overlay.upper));
        }
    }
    for bridge in &spec.vsock {
        match bridge.direction {
            VsockDirection::HostListens => all.push(Served::file(&bridge.socket)),
            VsockDirection::GuestListens => {
                if let Some(dir) = bridge.socket.parent() {
                    all.push(Served::dir(dir));
                }
            }
        }
    }
    if let Some(dir) = spec.console_log.as_deref().and_then(Path::parent) {
        all.push(Served::dir(dir));
    }
    all.push(Served::file(Path::new("/dev/kvm")));
    all.push(Served::dir(Path::new(OWN_DESCRIPTORS)));
    outermost(all)
}

/// `paths` without duplicates and without any path inside another one's directory.
fn outermost(mut paths: Vec<Served>) -> Vec<Served> {
    paths.sort_by(|a, b| a.path.cmp(&b.path));
    let mut kept: Vec<Served> = Vec::new();
    for served in paths {
        let covered = kept
            .iter()
            .any(|k| k.is_dir && served.path.starts_with(&k.path));
        if !covered && !kept.iter().any(|k| k.path == served.path) {
            kept.push(served);
        }
    }
    kept
}

/// The path of `path` (absolute) below `root`, refusing `..` so a served path can only name
/// a place inside the new root.
fn below(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut out = root.to_path_buf();
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a served path must be absolute and without ..",
                ))
            }
        }
    }
    Ok(out)
}

/// Moves the runner (and every process of its mount namespace) into a root holding only
/// [`served`]`(spec)`. Call after every mount of the guest's root is made, before libkrun
/// starts any thread.
pub fn enter(spec: &VmSpec) -> Result<(), OwnRootError> {
    // The pivot below moves every process of the mount namespace whose root is the host's:
    // only this one must move.
    idmap_mount::private_mount_namespace().map_err(|source| OwnRootError::Setup {
        what: "cannot make its mount namespace private",
        source,
    })?;
    let served = served(spec);
    // Copies first: the tmpfs below covers BUILD_DIR, where served paths may lie.
    let mut trees: Vec<(Served, OwnedFd)> = Vec::with_capacity(served.len());
    for item in served {
        let clone = if item.read_only {
            idmap_mount::read_only_clone_tree
        } else {
            idmap_mount::plain_clone_tree
        };
        let tree = clone(&item.path).map_err(|source| OwnRootError::Serve {
            path: item.path.clone(),
            source,
        })?;
        trees.push((item, tree));
    }
    let build = Path::new(BUILD_DIR);
    mount(
        Some("tmpfs"),
        build,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )
    .map_err(setup("cannot mount its tmpfs"))?;
    for (item, tree) in &trees {
        let serve_error = |source| OwnRootError::Serve {
            path: item.path.clone(),
            source,
        };
        let target = below(build, &item.path).map_err(serve_error)?;
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(serve_error)?;
        }
        if item.is_dir {
            fs::create_dir(&target).map_err(serve_error)?;
        } else {
            File::create(&target).map_err(serve_error)?;
        }
        idmap_mount::attach(tree, &target).map_err(serve_error)?;
    }
    drop(trees);
    // The directories leading to the served paths are read-only: nothing can be made beside
    // them. The served mounts keep their own flags.
    mount(
        None::<&str>,
        build,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(setup("cannot make its tmpfs read-only"))?;
    // pivot_root(".", ".") stacks the old root under the new one at the same place; the
    // detaching unmount then takes the whole host tree away.
    nix::unistd::chdir(build).map_err(setup("cannot enter its tmpfs"))?;
    nix::unistd::pivot_root(".", ".").map_err(setup("cannot pivot into its tmpfs"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(setup("cannot detach the host's root"))?;
    nix::unistd::chdir("/").map_err(setup("cannot enter its new root"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A layer laid out as plugin-libkrun lays it out, in a temporary directory `s`.
    fn layer() -> tempfile::TempDir {
        let s = tempfile::tempdir().unwrap();
        for dir in [
            "layer/root/work",
            "layer/agent",
            "layer/disk",
            "bus",
            "logs",
            "image",
        ] {
            fs::create_dir_all(s.path().join(dir)).unwrap();
        }
        fs::write(s.path().join("layer/disk.img"), b"").unwrap();
        s
    }

    fn spec(s: &Path, extra: serde_json::Value) -> VmSpec {
        let mut value = json!({
            "vcpus": 1, "memory_mib": 256, "root": s.join("layer/root"), "workload": "/agent",
            "shares": [{"tag": "agent", "host_path": s.join("layer/agent"), "guest_path": "/a",
                        "read_only": true},
                       {"tag": "work", "host_path": s.join("layer/root/work"),
                        "guest_path": "/w", "read_only": false}],
            "vsock": [{"port": 1024, "socket": s.join("layer/agent.sock"),
                       "direction": "host-listens"},
                      {"port": 1025, "socket": s.join("bus/bus.sock"),
                       "direction": "guest-listens"}],
        });
        if let (Some(value), serde_json::Value::Object(extra)) = (value.as_object_mut(), extra) {
            value.extend(extra);
        }
        VmSpec::from_json(&value.to_string()).unwrap()
    }

    /// The served paths, those of the layout relative to `s`.
    fn paths(s: &Path, served: &[Served]) -> Vec<(String, bool)> {
        served
            .iter()
            .map(|item| {
                let path = item.path.strip_prefix(s).unwrap_or(&item.path);
                (path.to_string_lossy().into_owned(), item.is_dir)
            })
            .collect()
    }

    #[test]
    fn the_root_holds_the_shares_sockets_kvm_and_its_descriptors_only() {
        let s = layer();
        let served = paths(s.path(), &served(&spec(s.path(), json!({}))));
        let mut expected = vec![
            ("/dev/kvm".to_string(), false),
            ("/proc/self/fd".to_string(), true),
            ("bus".to_string(), true),
            ("layer/agent".to_string(), true),
            ("layer/agent.sock".to_string(), false),
            ("layer/root".to_string(), true),
        ];
        let mut sorted = served.clone();
        sorted.sort();
        expected.sort();
        assert_eq!(
            sorted, expected,
            "the share inside the root comes with it; the layer directory itself is not served"
        );
    }

    #[test]
    fn a_guest_disk_its_mounts_and_a_console_log_are_served() {
        let s = layer();
        let spec = spec(
            s.path(),
            json!({
                "console_log": s.path().join("logs/console.log"),
                "root_overlay": {"lower": s.path().join("image"),
                                 "upper": s.path().join("layer/disk/upper"),
                                 "work": s.path().join("layer/disk/work"), "size_mib": 64,
                                 "guest_disk": s.path().join("layer/disk.img")},
            }),
        );
        let all = served(&spec);
        let served = paths(s.path(), &all);
        for (path, is_dir) in [
            ("layer/disk.img", false),
            ("layer/disk/mounts", true),
            ("logs", true),
        ] {
            let expected = (path.to_string(), is_dir);
            assert!(served.contains(&expected), "{expected:?} in {served:?}");
        }
        assert!(
            !served.iter().any(|(p, _)| p.starts_with("image")),
            "the overlay's layers are mounted before and never opened again: {served:?}"
        );
    }

    #[test]
    fn a_sandboxs_upper_directory_is_served_read_only_for_its_snapshots_and_nothing_beside_it() {
        let s = layer();
        fs::create_dir_all(s.path().join("snapshot")).unwrap();
        let spec = spec(
            s.path(),
            json!({
                "root_overlay": {"lower": s.path().join("image"),
                                 "layers": [s.path().join("snapshot")],
                                 "upper": s.path().join("layer/disk/upper"),
                                 "work": s.path().join("layer/disk/work"), "size_mib": 64},
            }),
        );
        let all = served(&spec);
        let upper: Vec<&Served> = all
            .iter()
            .filter(|item| item.path.starts_with(s.path().join("layer/disk")))
            .collect();
        assert_eq!(
            upper,
            [&Served::read_only_dir(&s.path().join("layer/disk/upper"))],
            "the upper directory alone, read-only; never the work directory or the tmpfs"
        );
        assert!(
            all.iter()
                .all(|item| item.read_only == item.path.ends_with("upper")),
            "everything else keeps its flags: {all:?}"
        );
        let served = paths(s.path(), &all);
        assert!(
            !served
                .iter()
                .any(|(p, _)| p.starts_with("image") || p.starts_with("snapshot")),
            "the image and the snapshot's layers are mounted before and never opened again: \
             {served:?}"
        );
    }

    #[test]
    fn a_worker_vms_persistent_layer_is_never_served() {
        let s = layer();
        let spec = spec(
            s.path(),
            json!({
                "root_overlay": {"lower": s.path().join("image"),
                                 "upper": s.path().join("layer/disk/upper"),
                                 "work": s.path().join("layer/disk/work"), "size_mib": 64,
                                 "guest_disk": s.path().join("layer/disk.img")},
            }),
        );
        assert!(
            !served(&spec).iter().any(|item| item.read_only),
            "a worker VM has no snapshot: nothing of its layer is served beside its disk"
        );
    }

    #[test]
    fn a_path_inside_a_served_directory_comes_with_it() {
        let kept = outermost(vec![
            Served::dir(Path::new("/a/b")),
            Served::file(Path::new("/a/b/c.sock")),
            Served::dir(Path::new("/a")),
            Served::dir(Path::new("/ab")),
            Served::dir(Path::new("/a")),
        ]);
        assert_eq!(
            kept,
            [Served::dir(Path::new("/a")), Served::dir(Path::new("/ab"))]
        );
    }

    #[test]
    fn a_served_path_cannot_climb_out_of_the_new_root() {
        let root = Path::new("/new");
        assert_eq!(
            below(root, Path::new("/a/./b")).unwrap(),
            Path::new("/new/a/b")
        );
        assert!(below(root, Path::new("/a/../../etc")).is_err());
    }

    /// What the runner sees after [`enter`], in a forked child: "" when it is as it should
    /// be, else what is wrong.
    fn inside_own_root(s: &Path, spec: &VmSpec) -> String {
        if let Err(e) = crate::overlay::enter_private_namespace() {
            return format!("private namespace: {e}");
        }
        if let Err(e) = enter(spec) {
            return e.to_string();
        }
        let mut wrong = Vec::new();
        let top: Vec<String> = fs::read_dir("/")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let first = s.components().nth(1).unwrap().as_os_str().to_string_lossy();
        let mut top_sorted = top.clone();
        top_sorted.sort();
        let mut expected = vec!["dev".to_string(), "proc".to_string(), first.into_owned()];
        expected.sort();
        if top_sorted != expected {
            wrong.push(format!("/ holds {top_sorted:?}, not {expected:?}"));
        }
        for host in ["/etc/passwd", "/usr", "/bin"] {
            if Path::new(host).exists() {
                wrong.push(format!("{host} is there"));
            }
        }
        // Above the guest's root: only the way to the served paths, nothing of the layer.
        let beside: Vec<String> = fs::read_dir(s.join("layer/root/.."))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let mut beside_sorted = beside;
        beside_sorted.sort();
        if beside_sorted != ["agent", "agent.sock", "root"] {
            wrong.push(format!("the root's parent holds {beside_sorted:?}"));
        }
        if fs::read(s.join("layer/root/work/file")).ok().as_deref() != Some(b"guest".as_slice()) {
            wrong.push("the root share's files are not served".into());
        }
        if fs::write(s.join("layer/root/work/new"), b"w").is_err() {
            wrong.push("the root share is not writable".into());
        }
        if fs::write(s.join("layer/beside"), b"w").is_ok() {
            wrong.push("a file was made beside the served paths".into());
        }
        if fs::read_dir("/proc/self/fd").map_or(0, Iterator::count) <= 2 {
            wrong.push("/proc/self/fd does not list our descriptors".into());
        }
        if fs::read_dir("/proc").map_or(0, Iterator::count) != 1 {
            wrong.push("/proc holds more than `self`".into());
        }
        if Path::new("/proc/1/root").exists() || Path::new("/proc/self/root").exists() {
            wrong.push("another root is reachable through /proc".into());
        }
        if let Some(found) = climbs_to_host_file(&s.join("layer/root")) {
            wrong.push(format!("`..` names from the share's root reach {found}"));
        }
        wrong.join("; ")
    }

    /// libkrun's virtio-fs lookup of a name a guest sends, made again and again with `..` from
    /// the root share (`openat(parent, name, O_PATH | O_NOFOLLOW)`, what its server does: a
    /// guest that took over its kernel could send these); then `etc/passwd` and `usr` from
    /// where that ends. The host file reached, if any.
    fn climbs_to_host_file(share: &Path) -> Option<String> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let mut dir = File::open(share).ok().map(OwnedFd::from)?;
        for _ in 0..32 {
            // SAFETY: a valid descriptor and a NUL-terminated name; the result is checked.
            let up = unsafe {
                libc::openat(
                    dir.as_raw_fd(),
                    c"..".as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if up < 0 {
                break;
            }
            // SAFETY: openat returned a new descriptor nothing else owns.
            dir = unsafe { OwnedFd::from_raw_fd(up) };
        }
        for name in [c"etc/passwd", c"usr"] {
            // SAFETY: as above.
            let fd = unsafe {
                libc::openat(
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if fd >= 0 {
                // SAFETY: closes the descriptor just opened.
                unsafe { libc::close(fd) };
                return Some(name.to_string_lossy().into_owned());
            }
        }
        None
    }

    #[test]
    fn without_its_own_root_dotdot_names_reach_the_host() {
        // The attack works where the runner has the host's root: what `own_root` takes away.
        let s = layer();
        if !Path::new("/etc/passwd").exists() {
            println!("DID NOT RUN: this host has no /etc/passwd to reach");
            return;
        }
        assert_eq!(
            climbs_to_host_file(&s.path().join("layer/root")).as_deref(),
            Some("etc/passwd")
        );
    }

    #[test]
    fn the_runner_sees_only_what_it_serves() {
        if !Path::new("/dev/kvm").exists() {
            println!("DID NOT RUN: this host has no /dev/kvm, which the runner's root serves");
            return;
        }
        let s = layer();
        fs::write(s.path().join("layer/root/work/file"), b"guest").unwrap();
        fs::write(s.path().join("layer/spec-and-logs"), b"host only").unwrap();
        fs::write(s.path().join("layer/agent.sock"), b"").unwrap();
        let spec = spec(s.path(), json!({}));
        let (mut read, mut write) = std::io::pipe().unwrap();
        // SAFETY: the child only runs the set-up under test, writes its outcome and _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                drop(read);
                let outcome = inside_own_root(s.path(), &spec);
                let _ = std::io::Write::write_all(&mut write, outcome.as_bytes());
                // SAFETY: ends the forked child without the test harness's destructors.
                unsafe { libc::_exit(0) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(write);
                let mut outcome = String::new();
                std::io::Read::read_to_string(&mut read, &mut outcome).unwrap();
                nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(outcome, "", "inside the runner's own root");
            }
        }
        assert_eq!(
            fs::read(s.path().join("layer/root/work/new")).unwrap(),
            b"w",
            "a write through the served root lands on the host's file"
        );
    }
}
