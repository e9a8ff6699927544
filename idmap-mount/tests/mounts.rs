//! The crate's mounts and namespaces, made for real. One process, one thread (`harness =
//! false`): a process may make a user namespace only while it has one thread, and the checks
//! mount in a mount namespace of the test's own, so nothing reaches the host's.
//!
//! As host root every check runs. As another user the test first becomes root of a user
//! namespace of its own, where the plain and read-only copies, the stage and the held
//! namespaces still run; the idmapped copies and a namespace's owner need host root and say
//! DID NOT RUN.

use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::ExitCode;

use nix::mount::{mount, MsFlags};
use nix::sched::CloneFlags;

type Check = (&'static str, fn(&Host));

struct Host {
    /// Root of the initial user namespace (not of one of the test's own).
    root: bool,
}

fn main() -> ExitCode {
    let checks: &[Check] = &[
        ("errors_name_the_path", errors_name_the_path),
        (
            "a_read_only_tree_copy_carries_submounts_and_refuses_writes",
            a_read_only_tree_copy_carries_submounts_and_refuses_writes,
        ),
        (
            "a_plain_copy_leaves_submounts_out_and_a_tree_copy_keeps_them",
            a_plain_copy_leaves_submounts_out_and_a_tree_copy_keeps_them,
        ),
        (
            "an_idmapped_copy_shows_and_stores_ids_through_the_map",
            an_idmapped_copy_shows_and_stores_ids_through_the_map,
        ),
        (
            "a_user_namespace_is_owned_by_the_ids_asked_for",
            a_user_namespace_is_owned_by_the_ids_asked_for,
        ),
        (
            "held_namespaces_are_new_and_their_holder_goes_with_them",
            held_namespaces_are_new_and_their_holder_goes_with_them,
        ),
        (
            "a_failing_map_writer_is_the_error_and_leaves_no_child",
            a_failing_map_writer_is_the_error_and_leaves_no_child,
        ),
        (
            "the_stage_is_a_tmpfs_others_may_enter",
            the_stage_is_a_tmpfs_others_may_enter,
        ),
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in checks {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    // Names to run (as libtest takes them); the harness's flags are ignored.
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let host = Host {
        root: nix::unistd::geteuid().is_root(),
    };
    if let Err(e) = enter_own_namespaces(host.root) {
        println!("*** DID NOT RUN: idmap-mount's mount checks: {e} ***");
        return ExitCode::SUCCESS;
    }
    // As libtest reports them, for scripts/test.sh's digest of failures: each panic under
    // its check's name, then the names of the checks that failed.
    let report = std::sync::Arc::new(std::panic::take_hook());
    let (mut ran, mut failed) = (0, Vec::new());
    for (name, check) in checks {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let (report, named) = (report.clone(), *name);
        std::panic::set_hook(Box::new(move |info| {
            eprintln!("---- {named} stdout ----");
            report(info);
        }));
        ran += 1;
        match std::panic::catch_unwind(|| check(&host)) {
            Ok(()) => eprintln!("test {name} ... ok"),
            Err(_) => {
                eprintln!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    if failed.is_empty() {
        eprintln!("test result: ok. {ran} passed");
        return ExitCode::SUCCESS;
    }
    eprintln!("\nfailures:");
    for name in &failed {
        eprintln!("    {name}");
    }
    eprintln!(
        "\ntest result: FAILED. {} passed; {} failed",
        ran - failed.len(),
        failed.len()
    );
    ExitCode::FAILURE
}

/// A private mount namespace; for a user other than root, inside a user namespace where the
/// test's user is root.
fn enter_own_namespaces(host_root: bool) -> io::Result<()> {
    if !host_root {
        let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
        nix::sched::unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| {
            io::Error::other(format!("not root, and no user namespace of its own: {e}"))
        })?;
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("0 {uid} 1"))?;
        std::fs::write("/proc/self/gid_map", format!("0 {gid} 1"))?;
    }
    idmap_mount::private_mount_namespace()
}

/// A mount made by a check, detached when dropped (before its directory is removed).
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A directory with a mount over it; the fields drop in order: the mount first.
struct Dir {
    _mounted: Mounted,
    dir: tempfile::TempDir,
}

impl Dir {
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// `source/a` on the source's filesystem, `source/sub/b` on a tmpfs mounted there.
fn source_with_submount() -> Dir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"a").unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    mount(
        Some("tmpfs"),
        &sub,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    std::fs::write(sub.join("b"), b"b").unwrap();
    Dir {
        _mounted: Mounted(sub),
        dir,
    }
}

fn attached(tree: &OwnedFd) -> Dir {
    let dir = tempfile::tempdir().unwrap();
    idmap_mount::attach(tree, dir.path()).unwrap();
    Dir {
        _mounted: Mounted(dir.path().to_path_buf()),
        dir,
    }
}

fn errors_name_the_path(_: &Host) {
    let missing = Path::new("/nonexistent/idmap-mount-test");
    let error = idmap_mount::plain_clone(missing).expect_err("no such path");
    assert_eq!(error.kind(), ErrorKind::NotFound);
    assert!(
        error
            .to_string()
            .starts_with("cannot clone the mount of /nonexistent/idmap-mount-test:"),
        "{error}"
    );
    let nul = idmap_mount::read_only_clone_tree(Path::new("a\0b")).expect_err("a NUL");
    assert_eq!(nul.kind(), ErrorKind::InvalidInput);
    let dir = tempfile::tempdir().unwrap();
    let tree = idmap_mount::plain_clone(dir.path()).unwrap();
    let error = idmap_mount::attach(&tree, missing).expect_err("no target");
    assert!(
        error
            .to_string()
            .starts_with("cannot attach a mount at /nonexistent/idmap-mount-test:"),
        "{error}"
    );
}

fn a_read_only_tree_copy_carries_submounts_and_refuses_writes(_: &Host) {
    let source = source_with_submount();
    let copy = attached(&idmap_mount::read_only_clone_tree(source.path()).unwrap());
    assert_eq!(std::fs::read(copy.path().join("a")).unwrap(), b"a");
    assert_eq!(std::fs::read(copy.path().join("sub/b")).unwrap(), b"b");
    // Whatever the modes: the mount refuses, the submount's copy too.
    std::fs::set_permissions(source.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    for path in ["new", "sub/new", "a"] {
        let error = std::fs::write(copy.path().join(path), b"x").expect_err(path);
        assert_eq!(error.raw_os_error(), Some(libc::EROFS), "{path}: {error}");
    }
    // The source stays writable.
    std::fs::write(source.path().join("sub/new"), b"x").unwrap();
}

fn a_plain_copy_leaves_submounts_out_and_a_tree_copy_keeps_them(_: &Host) {
    let source = source_with_submount();
    let plain = attached(&idmap_mount::plain_clone(source.path()).unwrap());
    assert_eq!(std::fs::read(plain.path().join("a")).unwrap(), b"a");
    assert_eq!(
        std::fs::read_dir(plain.path().join("sub")).unwrap().count(),
        0,
        "the submount is not in a plain copy"
    );
    let tree = attached(&idmap_mount::plain_clone_tree(source.path()).unwrap());
    assert_eq!(std::fs::read(tree.path().join("sub/b")).unwrap(), b"b");
    // Writable, and a write is the source's.
    std::fs::write(tree.path().join("sub/c"), b"c").unwrap();
    assert_eq!(std::fs::read(source.path().join("sub/c")).unwrap(), b"c");
}

/// The map a root runner gives a sandbox: its ids `0..65536` are host `100000..`.
const BASE: u32 = 100_000;

fn write_sandbox_map(pid: i32) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {BASE} 65536"))?;
    std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {BASE} 65536"))
}

fn an_idmapped_copy_shows_and_stores_ids_through_the_map(host: &Host) {
    if !host.root {
        println!("*** an_idmapped_copy_shows_and_stores_ids_through_the_map DID NOT RUN: idmapped mounts need host root ***");
        return;
    }
    let source = source_with_submount();
    std::fs::set_permissions(source.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let owned = source.path().join("owned");
    std::fs::write(&owned, b"").unwrap();
    std::os::unix::fs::chown(&owned, Some(1000), Some(1001)).unwrap();
    let unmapped = source.path().join("unmapped");
    std::fs::write(&unmapped, b"").unwrap();
    std::os::unix::fs::chown(&unmapped, Some(70_000), Some(70_000)).unwrap();
    let userns = idmap_mount::new_user_namespace(None, write_sandbox_map).unwrap();
    let copy = attached(&idmap_mount::idmapped_clone_tree(source.path(), &userns).unwrap());
    let ids = |path: &str| {
        let meta = std::fs::symlink_metadata(copy.path().join(path)).unwrap();
        (meta.uid(), meta.gid())
    };
    assert_eq!(ids("a"), (BASE, BASE));
    assert_eq!(ids("owned"), (BASE + 1000, BASE + 1001));
    // Past the map: the overflow id.
    assert_eq!(ids("unmapped"), (65534, 65534));
    // The submount's copy is idmapped too.
    assert_eq!(ids("sub/b"), (BASE, BASE));
    // Host root is no id of the map: it may not create files through it.
    let error = std::fs::write(copy.path().join("by-root"), b"").expect_err("unmapped writer");
    assert_eq!(error.raw_os_error(), Some(libc::EOVERFLOW), "{error}");
    // A write by the sandbox's 1000 (host 101000) is stored as 1000.
    let as_sandbox = |id: u32| {
        // SAFETY: setfsuid/setfsgid change only this (single) thread's filesystem ids.
        unsafe {
            libc::setfsgid(id);
            libc::setfsuid(id);
        }
    };
    as_sandbox(BASE + 1000);
    let written = std::fs::write(copy.path().join("by-guest"), b"");
    as_sandbox(0);
    written.unwrap();
    let stored = std::fs::metadata(source.path().join("by-guest")).unwrap();
    assert_eq!((stored.uid(), stored.gid()), (1000, 1000));
    // A single mount's copy: the same ids, no submount.
    let single = attached(&idmap_mount::idmapped_clone(source.path(), &userns).unwrap());
    let meta = std::fs::metadata(single.path().join("owned")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (BASE + 1000, BASE + 1001));
    assert_eq!(
        std::fs::read_dir(single.path().join("sub"))
            .unwrap()
            .count(),
        0
    );
}

/// `NS_GET_OWNER_UID` of ioctl_ns(2): the uid that owns a user namespace.
const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;

fn owner_of(userns: &OwnedFd) -> u32 {
    let mut uid: libc::uid_t = u32::MAX;
    // SAFETY: the descriptor is a user namespace's and `uid` outlives the call, which writes
    // one uid_t through the pointer.
    let rc = unsafe { libc::ioctl(userns.as_raw_fd(), NS_GET_OWNER_UID, &mut uid) };
    assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    uid
}

fn a_user_namespace_is_owned_by_the_ids_asked_for(host: &Host) {
    if !host.root {
        println!("*** a_user_namespace_is_owned_by_the_ids_asked_for DID NOT RUN: a namespace owned by other ids needs host root ***");
        return;
    }
    let userns = idmap_mount::new_user_namespace(Some((4242, 4243)), write_sandbox_map).unwrap();
    assert_eq!(owner_of(&userns), 4242);
    let own = idmap_mount::new_user_namespace(None, write_sandbox_map).unwrap();
    assert_eq!(owner_of(&own), 0);
}

fn inode(fd: &OwnedFd) -> u64 {
    nix::sys::stat::fstat(fd.as_raw_fd()).unwrap().st_ino
}

fn held_namespaces_are_new_and_their_holder_goes_with_them(_: &Host) {
    let held = idmap_mount::hold_new_namespaces(None, CloneFlags::CLONE_NEWNET, |pid| {
        std::fs::write(format!("/proc/{pid}/uid_map"), "0 0 1")
    })
    .unwrap();
    let ours = |kind: &str| OwnedFd::from(File::open(format!("/proc/self/ns/{kind}")).unwrap());
    for kind in ["user", "net"] {
        let theirs = held.open(kind).unwrap();
        assert_ne!(inode(&theirs), inode(&ours(kind)), "{kind}");
    }
    // Named by the holder's pid while held: its uid map is the one written.
    let pid = held.pid();
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    assert_eq!(map.split_whitespace().collect::<Vec<_>>(), ["0", "0", "1"]);
    let net = held.open("net").unwrap();
    drop(held);
    // Reaped: no child of ours is left, not even a zombie.
    assert_eq!(
        nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)),
        Err(nix::errno::Errno::ECHILD)
    );
    // A descriptor taken while held keeps its namespace.
    assert_ne!(inode(&net), inode(&ours("net")));
}

fn a_failing_map_writer_is_the_error_and_leaves_no_child(_: &Host) {
    let error = idmap_mount::new_user_namespace(None, |_| Err(io::Error::other("no map")))
        .expect_err("the writer failed");
    assert_eq!(error.to_string(), "no map");
    assert_eq!(
        nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)),
        Err(nix::errno::Errno::ECHILD)
    );
}

fn the_stage_is_a_tmpfs_others_may_enter(_: &Host) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("covered"), b"").unwrap();
    let files = tempfile::tempdir().unwrap();
    std::fs::create_dir(files.path().join("d")).unwrap();
    std::fs::write(files.path().join("d/in"), b"in").unwrap();
    std::fs::write(files.path().join("f"), b"f").unwrap();
    // Copies taken before the stage covers the directory.
    let d = idmap_mount::plain_clone(&files.path().join("d")).unwrap();
    let f = idmap_mount::plain_clone(&files.path().join("f")).unwrap();
    let stage = idmap_mount::Stage::mount(dir.path()).unwrap();
    let _stage = Mounted(dir.path().to_path_buf());
    let fs = nix::sys::statfs::statfs(dir.path()).unwrap();
    assert_eq!(fs.filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
    let flags = nix::sys::statvfs::statvfs(dir.path()).unwrap().flags();
    use nix::sys::statvfs::FsFlags;
    assert!(
        flags.contains(FsFlags::ST_NOSUID | FsFlags::ST_NODEV),
        "{flags:?}"
    );
    let mode = std::fs::metadata(dir.path()).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755);
    assert!(!dir.path().join("covered").exists());
    let placed_dir = stage.place(&d, "d", true).unwrap();
    let _d = Mounted(placed_dir.clone());
    let placed_file = stage.place(&f, "f", false).unwrap();
    let _f = Mounted(placed_file.clone());
    assert_eq!(placed_dir, dir.path().join("d"));
    assert_eq!(std::fs::read(placed_dir.join("in")).unwrap(), b"in");
    assert_eq!(std::fs::read(placed_file).unwrap(), b"f");
}
