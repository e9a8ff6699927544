//! A root runner gives host root up before the VM starts.
//!
//! Started by a root adapter, the runner needs host root only for its set-up: to attach a
//! worker's layer image to a loop device, and to show files to unprivileged ids. Then it
//! becomes root of a user namespace whose ids `0..count` are the adapter's subordinate range
//! (the range bwrap sandboxes get), keeping only `/dev/kvm`'s group of the host's: libkrun,
//! its virtio-fs server included, runs as host ids no one holds, with capabilities over its
//! own namespace only. A bug in libkrun a guest could reach then gains it that, not host root.
//!
//! What the VM uses is shown to those ids through idmapped mounts gathered on a stage (a
//! tmpfs over `/tmp` in the runner's private mount namespace; the host's `/tmp` is untouched),
//! where the state directory's parents (`/root`, a 0700 directory) would stop them: the image
//! root as `lower`, the sandbox's layer directory (its loop-mounted image inside) as `layer`,
//! every other bind or share source as `bind-N`, a snapshot's layers as `snapshot-N` (plain
//! copies, read-only: their files hold the range's host ids). On disk the files keep the ids the guest sees
//! (the image's own owners, as for bwrap's root launcher). The runner then makes a mount
//! namespace of its user namespace, where it mounts the overlay, its tmpfs and the guest's
//! mounts as an ordinary user's runner does.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};

use crate::spec::{DropRoot, GuestMount, VmSpec};

/// Where the idmapped copies are gathered, in the runner's private mount namespace.
const STAGE: &str = crate::spec::DROP_ROOT_STAGE;

/// Why the runner could not give host root up (it then does not boot: never as host root).
#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error("cannot make the runner's user namespace: {0}")]
    Namespace(io::Error),
    #[error("cannot show {what} to the runner's ids: {source}")]
    Stage { what: String, source: io::Error },
    #[error(transparent)]
    Image(#[from] crate::overlay::OverlayError),
    #[error(
        "/dev/kvm: a root adapter's runner gives host root up and then needs /dev/kvm through \
         its group (Debian's udev: root:kvm 0660); {0}"
    )]
    Kvm(String),
    #[error("cannot become root of the runner's user namespace: {0}")]
    Enter(String),
    #[error("cannot hand the console to the runner's ids: {0}")]
    Console(io::Error),
}

fn stage_error(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> DropError {
    let what = what.to_string();
    move |source| DropError::Stage { what, source }
}

/// Sets the VM's files up as host root, then becomes root of the runner's user namespace;
/// returns `spec` with every host path rewritten to its staged copy. The caller is host root,
/// single-threaded, in a private mount namespace of its own.
pub fn stage_and_drop(spec: &VmSpec, ids: &DropRoot) -> Result<VmSpec, DropError> {
    let userns = range_namespace(ids)?;
    // A persistent layer's image is attached before the layer is cloned with it inside; what
    // it holds is owned on disk by the ids the guest sees (0: its root), through the idmap.
    if let Some(overlay) = &spec.root_overlay {
        crate::overlay::mount_image(overlay)?;
    }
    let staged = stage(spec, ids, &userns)?;
    if let Some(fd) = spec.console_fd {
        hand_over_console(fd, ids.uid, ids.gid)?;
    }
    let kvm_group = kvm_group()?;
    enter(&userns, kvm_group)?;
    // Tied to the parent again: a change of credentials clears the parent-death signal.
    crate::launch::die_with_parent().map_err(|e| DropError::Enter(e.to_string()))?;
    File::options()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(|e| DropError::Kvm(format!("opening it as the runner's ids: {e}")))?;
    Ok(staged)
}

/// A user namespace whose ids `0..count` are `ids`' host ranges, owned by its first uid (so
/// pasta, running as it, may join); its maps are written from here, as host root.
fn range_namespace(ids: &DropRoot) -> Result<OwnedFd, DropError> {
    idmap_mount::new_user_namespace(Some((ids.uid, ids.gid)), |pid| {
        for (file, base) in [("uid_map", ids.uid), ("gid_map", ids.gid)] {
            let map = format!("0 {base} {}\n", ids.count);
            std::fs::write(format!("/proc/{pid}/{file}"), map)?;
        }
        Ok(())
    })
    .map_err(DropError::Namespace)
}

/// libkrun reopens the console by `/proc/self/fd/N`, which checks the owner of what it
/// names: a pipe (what the adapter gives) becomes the runner ids'. Anything else (a terminal,
/// a file of whoever started the runner by hand) is left as it is.
fn hand_over_console(fd: i32, uid: u32, gid: u32) -> Result<(), DropError> {
    let stat = nix::sys::stat::fstat(fd).map_err(|e| DropError::Console(e.into()))?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return Ok(());
    }
    nix::unistd::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
        .map_err(|e| DropError::Console(e.into()))
}

/// Clones what the VM uses through the runner's id map, attaches the clones on the stage and
/// returns the spec naming them.
fn stage(spec: &VmSpec, ids: &DropRoot, userns: &OwnedFd) -> Result<VmSpec, DropError> {
    let stage = Path::new(STAGE);
    let mut staged = spec.clone();
    // (copy, its name on the stage, whether a directory)
    let mut clones: Vec<(OwnedFd, String, bool)> = Vec::new();
    // Clones first: the stage covers /tmp, where the originals may live.
    let layer = idmap_mount::idmapped_clone_tree(&ids.layer, userns).map_err(stage_error(
        format_args!("the layer {}", ids.layer.display()),
    ))?;
    clones.push((layer, "layer".into(), true));
    let in_layer = |path: &Path| -> Option<PathBuf> {
        let relative = path.strip_prefix(&ids.layer).ok()?;
        Some(stage.join("layer").join(relative))
    };
    // A writable source (a worker's `/state` directory of an older version) is seen through
    // the idmap too: what the guest writes there keeps on disk the ids it sees, as it did when
    // the runner was host root (bwrap's root launcher moves such a directory into the range
    // instead; the state directory is closed to other users either way).
    let mut outside = |path: &Path| -> Result<PathBuf, DropError> {
        if let Some(staged) = in_layer(path) {
            return Ok(staged);
        }
        let what = || format!("{}", path.display());
        let is_dir = std::fs::metadata(path)
            .map_err(stage_error(what()))?
            .is_dir();
        let tree = idmap_mount::idmapped_clone(path, userns).map_err(stage_error(what()))?;
        let name = format!("bind-{}", clones.len());
        let target = stage.join(&name);
        clones.push((tree, name, is_dir));
        Ok(target)
    };
    if let Some(overlay) = &mut staged.root_overlay {
        let lower = outside(&overlay.lower)?;
        overlay.lower = lower;
        for path in [&mut overlay.upper, &mut overlay.work] {
            *path = in_layer(path).ok_or_else(|| not_in_layer(path))?;
        }
        for path in [&mut overlay.image, &mut overlay.guest_disk]
            .into_iter()
            .flatten()
        {
            *path = in_layer(path).ok_or_else(|| not_in_layer(path))?;
        }
    }
    staged.root = in_layer(&staged.root).ok_or_else(|| not_in_layer(&spec.root))?;
    for share in &mut staged.shares {
        share.host_path = outside(&share.host_path)?;
    }
    for mount in &mut staged.mounts {
        if let GuestMount::Bind { host_path, .. } = mount {
            *host_path = outside(host_path)?;
        }
    }
    // A snapshot's layers were copied by host root from sandboxes of this same range: their
    // files hold the range's host ids already, so they are shown as they are (read-only; an
    // idmap would shift those ids again).
    if let Some(overlay) = &mut staged.root_overlay {
        for layer in &mut overlay.layers {
            let tree = idmap_mount::read_only_clone_tree(layer).map_err(stage_error(
                format_args!("the snapshot layer {}", layer.display()),
            ))?;
            let name = format!("snapshot-{}", clones.len());
            clones.push((tree, name.clone(), true));
            *layer = stage.join(name);
        }
    }
    for port in &mut staged.vsock {
        port.socket = in_layer(&port.socket).ok_or_else(|| not_in_layer(&port.socket))?;
    }
    if let Some(log) = &mut staged.console_log {
        *log = in_layer(log).ok_or_else(|| not_in_layer(log))?;
    }
    let on_stage = idmap_mount::Stage::mount(stage).map_err(stage_error("the stage"))?;
    for (tree, name, is_dir) in &clones {
        on_stage
            .place(tree, name, *is_dir)
            .map_err(stage_error(stage.join(name).display()))?;
    }
    Ok(staged)
}

fn not_in_layer(path: &Path) -> DropError {
    DropError::Stage {
        what: path.display().to_string(),
        source: io::Error::other("not in the layer directory drop_root names"),
    }
}

/// The group the runner keeps to open `/dev/kvm` (none when every user may).
fn kvm_group() -> Result<Option<Gid>, DropError> {
    let kvm = std::fs::metadata("/dev/kvm").map_err(|e| DropError::Kvm(e.to_string()))?;
    match kvm.mode() & 0o066 {
        mode if mode & 0o006 == 0o006 => Ok(None),
        mode if mode & 0o060 == 0o060 && kvm.gid() != 0 => Ok(Some(Gid::from_raw(kvm.gid()))),
        _ => Err(DropError::Kvm(format!(
            "it is mode {:o}, group {}",
            kvm.mode() & 0o777,
            kvm.gid()
        ))),
    }
}

/// Joins the namespace as its root: uid and gid 0 inside, `kvm_group` the only host group
/// kept, every capability of the namespace and none of the host's; then a mount namespace of
/// its own, where it may mount (the staged mounts come along, locked).
fn enter(userns: &OwnedFd, kvm_group: Option<Gid>) -> Result<(), DropError> {
    let fail = |what: &str, e: nix::Error| DropError::Enter(format!("{what}: {e}"));
    let groups: Vec<Gid> = kvm_group.into_iter().collect();
    setgroups(&groups).map_err(|e| fail("setgroups", e))?;
    setns(userns, CloneFlags::CLONE_NEWUSER).map_err(|e| fail("setns", e))?;
    let (root_uid, root_gid) = (Uid::from_raw(0), Gid::from_raw(0));
    setresgid(root_gid, root_gid, root_gid).map_err(|e| fail("setresgid", e))?;
    setresuid(root_uid, root_uid, root_uid).map_err(|e| fail("setresuid", e))?;
    idmap_mount::private_mount_namespace().map_err(|e| DropError::Enter(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_mounts::{self, Layer};
    use crate::overlay;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;

    const BASE: u32 = 2_000_000_000;

    fn spec_for(dir: &Path) -> VmSpec {
        let layer = dir.join("layer");
        let value = serde_json::json!({
            "vcpus": 1, "memory_mib": 512, "root": layer.join("root"), "workload": "/a",
            "root_overlay": {"lower": dir.join("image"), "upper": layer.join("disk/upper"),
                             "work": layer.join("disk/work"), "size_mib": 8},
            "shares": [{"tag": "agent", "host_path": layer.join("agent"), "guest_path": "/a",
                        "read_only": true}],
            "mounts": [{"kind": "bind", "host_path": dir.join("worker"), "guest_path": "/worker",
                        "read_only": true}],
            "drop_root": {"uid": BASE, "gid": BASE, "count": 65536, "layer": layer},
        });
        VmSpec::from_json(&value.to_string()).unwrap()
    }

    /// What the runner does between its private mount namespace and libkrun, as host root,
    /// in a forked child: every check must hold there (its failure comes back as text).
    fn as_dropped_runner(spec: &VmSpec) -> Result<(), String> {
        let ids = spec.drop_root.clone().unwrap();
        overlay::enter_private_namespace().map_err(|e| e.to_string())?;
        let userns = range_namespace(&ids).map_err(|e| e.to_string())?;
        let staged = stage(spec, &ids, &userns).map_err(|e| e.to_string())?;
        // The console: a pipe of host root's, reopened by libkrun through /proc/self/fd.
        let (_console_read, console) = std::io::pipe().map_err(|e| e.to_string())?;
        let console_fd = std::os::fd::AsRawFd::as_raw_fd(&console);
        hand_over_console(console_fd, BASE, BASE).map_err(|e| e.to_string())?;
        enter(&userns, None).map_err(|e| e.to_string())?;
        File::options()
            .write(true)
            .open(format!("/proc/self/fd/{console_fd}"))
            .map_err(|e| format!("reopening the console: {e}"))?;
        let overlay_spec = staged.root_overlay.as_ref().unwrap();
        overlay::mount(&staged.root, overlay_spec, false).map_err(|e| e.to_string())?;
        let disk = overlay_spec.disk_dir().unwrap();
        guest_mounts::apply(&staged.root, &staged.mounts, Layer::OnHost(disk))
            .map_err(|e| e.to_string())?;
        let map = std::fs::read_to_string("/proc/self/uid_map").map_err(|e| e.to_string())?;
        if !map.split_whitespace().eq(["0", &BASE.to_string(), "65536"]) {
            return Err(format!("uid_map {map:?}"));
        }
        // The image's owners hold inside, its root-only file is the guest root's.
        let root = &staged.root;
        let owned = std::fs::metadata(root.join("etc/owned-by-1000")).map_err(|e| e.to_string())?;
        if (owned.uid(), owned.gid()) != (1000, 1000) {
            return Err(format!("image file owned {}:{}", owned.uid(), owned.gid()));
        }
        std::fs::read(root.join("etc/secret")).map_err(|e| format!("image secret: {e}"))?;
        std::fs::read(root.join("worker/app.txt")).map_err(|e| format!("bind: {e}"))?;
        std::fs::read(staged.shares[0].host_path.join("agent"))
            .map_err(|e| format!("share: {e}"))?;
        // What the guest writes is its own, in the bounded layer, with any id it has.
        let new = root.join("etc/made-inside");
        std::fs::write(&new, b"x").map_err(|e| format!("write: {e}"))?;
        nix::unistd::chown(&new, Some(Uid::from_raw(7)), Some(Gid::from_raw(7)))
            .map_err(|e| format!("chown inside: {e}"))?;
        // The host's files are not: host root's secrets and device nodes stay closed.
        for host in ["/etc/shadow", "/dev/mem"] {
            match File::open(host) {
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                other => return Err(format!("{host} opened as the dropped runner: {other:?}")),
            }
        }
        if std::fs::write(root.join("worker/app.txt"), b"changed").is_ok() {
            return Err("wrote through a read-only bind".into());
        }
        Ok(())
    }

    #[test]
    fn a_root_runner_gives_root_up_and_still_serves_its_files() {
        if !nix::unistd::geteuid().is_root() {
            println!("DID NOT RUN: giving root up needs a runner started by host root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in [
            "image/etc",
            "layer/root",
            "layer/disk",
            "layer/agent",
            "worker",
        ] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        // A 0700 parent, as the adapter's state directory is.
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(d.join("image/etc/owned-by-1000"), b"u").unwrap();
        std::os::unix::fs::chown(d.join("image/etc/owned-by-1000"), Some(1000), Some(1000))
            .unwrap();
        std::fs::write(d.join("image/etc/secret"), b"s").unwrap();
        std::fs::set_permissions(
            d.join("image/etc/secret"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(d.join("layer/agent/agent"), b"a").unwrap();
        std::fs::write(d.join("worker/app.txt"), b"app").unwrap();
        let spec = spec_for(d);
        let (mut read, mut write) = std::io::pipe().unwrap();
        // SAFETY: the child only runs the set-up under test, writes its outcome and _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                drop(read);
                let outcome = as_dropped_runner(&spec).err().unwrap_or_default();
                let _ = write.write_all(outcome.as_bytes());
                // SAFETY: ends the forked child without the test harness's destructors.
                unsafe { libc::_exit(0) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(write);
                let mut outcome = String::new();
                read.read_to_string(&mut outcome).unwrap();
                nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(outcome, "", "the dropped runner's set-up");
            }
        }
        // The guest's writes went to its tmpfs: the image and the layer on disk are as they were.
        assert!(!d.join("image/etc/made-inside").exists());
        assert_eq!(std::fs::read_dir(d.join("layer/disk")).unwrap().count(), 0);
        assert_eq!(std::fs::read(d.join("worker/app.txt")).unwrap(), b"app");
    }
}
