//! Turns a validated specification into a running libkrun VM.

use std::convert::Infallible;

use crate::drop_root::{self, DropError};
use crate::firmware::{self, FirmwareError};
use crate::guest_mounts::{self, MountError};
use crate::krun::{Context, KrunError};
use crate::launch_file::{self, INIT_PATH, LAUNCH_PATH};
use crate::overlay::{self, OverlayError};
use crate::own_root;
use crate::probe::{self, HostUnfit};
use crate::spec::{VmSpec, VsockDirection};

/// The guest init shim, built statically from `guest/vm-init.c` by the build script.
pub const GUEST_INIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vm-init"));

/// Why the VM did not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("this host cannot boot microVMs: {0}")]
    HostUnfit(#[from] HostUnfit),
    #[error(transparent)]
    Firmware(#[from] FirmwareError),
    #[error(transparent)]
    Overlay(#[from] OverlayError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Krun(#[from] KrunError),
    #[error("cannot arrange to die with the parent process: {0}")]
    DeathSignal(std::io::Error),
    #[error("console_fd {0} is not an open descriptor of ours: {1}")]
    ConsoleFd(i32, std::io::Error),
    #[error("the guest's network: {0}")]
    Egress(String),
    #[error("a root runner gives host root up: {0}")]
    DropRoot(#[from] DropError),
    #[error(transparent)]
    OwnRoot(#[from] crate::own_root::OwnRootError),
    #[error("cannot confine the runner (capabilities, seccomp): {0}")]
    Seccomp(String),
    #[error("cannot set the runner's limit of open files (RLIMIT_NOFILE): {0}")]
    NoFile(nix::errno::Errno),
}

/// Checks that the inherited console descriptor is open, and marks one above stderr
/// close-on-exec: only libkrun, in this process, writes to it, and nothing we might start
/// may hold the pipe open past our end (its reader waits for that end to drain it).
fn keep_from_children(fd: i32) -> std::io::Result<()> {
    // SAFETY: F_GETFD and F_SETFD take and return integers; an fd we do not own fails
    // with EBADF and nothing else happens.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 || (fd > 2 && libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) < 0) {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes the kernel SIGKILL us when the parent dies, so no VM outlives its owner.
pub fn die_with_parent() -> Result<(), LaunchError> {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory of ours.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if ret != 0 {
        return Err(LaunchError::DeathSignal(std::io::Error::last_os_error()));
    }
    // The parent may have died before the prctl: then nobody would ever kill us.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        return Err(LaunchError::DeathSignal(std::io::Error::other(
            "the parent exited before the VM started",
        )));
    }
    Ok(())
}

/// `RLIMIT_NOFILE` in the guest's (Linux) numbering, whatever the host's.
pub const GUEST_RLIMIT_NOFILE: u32 = 7;
/// The block id of the guest disk (`root_overlay.guest_disk`), which the guest sees as
/// `/dev/vda`: the only virtio-blk device a VM has.
pub const GUEST_DISK_ID: &str = "layer";

/// One libkrun configuration call, as [`krun_calls`] derives them from a specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KrunCall {
    /// `krun_set_vm_config`: SMT is always off there (libkrun 1.19.7 hard-codes it).
    VmConfig { vcpus: u8, memory_mib: u32 },
    /// `krun_set_nested_virt(true)`.
    NestedVirt,
    /// `krun_set_root`.
    Root(String),
    /// `krun_add_virtiofs3`, `shm_bytes` its DAX window (0: none).
    Virtiofs {
        tag: String,
        path: String,
        shm_bytes: u64,
        read_only: bool,
    },
    /// `krun_add_disk`, writable: the guest's own writable layer (`root_overlay.guest_disk`).
    Disk { block_id: String, path: String },
    /// `krun_disable_implicit_vsock` then `krun_add_vsock(0)`: no TSI.
    DisableNetworking,
    /// `krun_disable_implicit_vsock` then `krun_add_vsock(KRUN_TSI_HIJACK_INET)`: TSI for the
    /// guest's inet sockets, never its unix ones.
    TsiInetOnly,
    /// `krun_add_vsock_port2`.
    VsockPort {
        port: u32,
        socket: String,
        guest_listens: bool,
    },
    /// `krun_set_console_output`.
    ConsoleOutput(String),
    /// `krun_set_rlimits`.
    Rlimits(Vec<String>),
}

/// The configuration calls `spec` makes, in order (the overlay files of the guest's init
/// come after them).
pub fn krun_calls(spec: &VmSpec) -> Vec<KrunCall> {
    let mut calls = vec![KrunCall::VmConfig {
        vcpus: spec.vcpus,
        memory_mib: spec.memory_mib,
    }];
    if spec.nested_virt {
        calls.push(KrunCall::NestedVirt);
    }
    calls.push(KrunCall::Root(spec.root.to_string_lossy().into_owned()));
    let shm_bytes = u64::from(spec.virtiofs_shm_size_mib) << 20;
    for share in &spec.shares {
        calls.push(KrunCall::Virtiofs {
            tag: share.tag.clone(),
            path: share.host_path.to_string_lossy().into_owned(),
            shm_bytes,
            read_only: share.read_only,
        });
    }
    // Writable: a writable bind among the mounts (a worker's /state on the host) must stay
    // so; the read-only ones are read-only mounts on the host side.
    if let Some(dir) = spec
        .root_overlay
        .as_ref()
        .and_then(|o| o.guest_mounts_dir())
    {
        calls.push(KrunCall::Virtiofs {
            tag: crate::spec::MOUNTS_TAG.into(),
            path: dir.to_string_lossy().into_owned(),
            shm_bytes: 0,
            read_only: false,
        });
    }
    if let Some(disk) = spec
        .root_overlay
        .as_ref()
        .and_then(|o| o.guest_disk.as_ref())
    {
        calls.push(KrunCall::Disk {
            block_id: GUEST_DISK_ID.into(),
            path: disk.to_string_lossy().into_owned(),
        });
    }
    calls.push(if spec.network {
        KrunCall::TsiInetOnly
    } else {
        KrunCall::DisableNetworking
    });
    for bridge in &spec.vsock {
        calls.push(KrunCall::VsockPort {
            port: bridge.port,
            socket: bridge.socket.to_string_lossy().into_owned(),
            guest_listens: bridge.direction == VsockDirection::GuestListens,
        });
    }
    if let Some(log) = &spec.console_log {
        calls.push(KrunCall::ConsoleOutput(log.to_string_lossy().into_owned()));
    }
    // libkrun opens the console by path; this one reopens the inherited pipe.
    if let Some(fd) = spec.console_fd {
        calls.push(KrunCall::ConsoleOutput(format!("/proc/self/fd/{fd}")));
    }
    if let Some(limit) = spec.nofile_limit {
        calls.push(KrunCall::Rlimits(vec![format!(
            "{GUEST_RLIMIT_NOFILE}={limit}:{limit}"
        )]));
    }
    calls
}

fn make(ctx: &Context, call: &KrunCall) -> Result<(), KrunError> {
    match call {
        KrunCall::VmConfig { vcpus, memory_mib } => ctx.set_vm_config(*vcpus, *memory_mib),
        KrunCall::NestedVirt => ctx.set_nested_virt(true),
        KrunCall::Root(root) => ctx.set_root(root),
        KrunCall::Virtiofs {
            tag,
            path,
            shm_bytes,
            read_only,
        } => ctx.add_virtiofs(tag, path, *shm_bytes, *read_only),
        KrunCall::Disk { block_id, path } => ctx.add_disk(block_id, path),
        KrunCall::DisableNetworking => ctx.disable_networking(),
        KrunCall::TsiInetOnly => ctx.tsi_inet_only(),
        KrunCall::VsockPort {
            port,
            socket,
            guest_listens,
        } => ctx.add_vsock_port(*port, socket, *guest_listens),
        KrunCall::ConsoleOutput(file) => ctx.set_console_output(file),
        KrunCall::Rlimits(limits) => ctx.set_rlimits(limits),
    }
}

/// Probes the host, configures libkrun from `spec` and boots. Never returns on success:
/// libkrun exits the process with the guest workload's status.
pub fn boot(spec: &VmSpec) -> Result<Infallible, LaunchError> {
    if let Some(fd) = spec.console_fd {
        keep_from_children(fd).map_err(|e| LaunchError::ConsoleFd(fd, e))?;
    }
    probe::host_can_boot()?;
    firmware::preload(&probe::find_libkrunfw()?)?;
    // pasta must run with the host's network and ids: its starter is forked before this
    // process enters any namespace of its own.
    let pasta = match &spec.egress {
        Some(_) => Some(
            egress::netns::PastaStarter::fork()
                .map_err(|e| LaunchError::Egress(format!("cannot fork pasta's starter: {e}")))?,
        ),
        None => None,
    };
    // After pasta's starter (pasta keeps the bound it is given and its own flow limits), while
    // the runner may still be host root, which may raise its hard limit.
    hold_files_for_the_guest(runner_nofile(spec))?;
    // Before libkrun starts any thread: unshare(CLONE_NEWNS) needs a single-threaded process.
    // The overlay first, then the extra mounts inside it; all of it is seen by this process
    // (and so by libkrun's virtio-fs server) only. An ordinary user's runner needs its own
    // user namespace for the network namespace too.
    // A root runner with `drop_root` then gives host root up (see `drop_root.rs`): from
    // there on `spec` names the staged copies of its files.
    let dropping = spec
        .drop_root
        .as_ref()
        .filter(|_| nix::unistd::geteuid().is_root());
    // Always: the runner ends in a root of its own (`own_root.rs`), made in this namespace.
    overlay::enter_private_namespace()?;
    let staged = match dropping {
        Some(ids) => Some(drop_root::stage_and_drop(spec, ids)?),
        None => None,
    };
    let spec = staged.as_ref().unwrap_or(spec);
    if let Some(root_overlay) = &spec.root_overlay {
        overlay::mount(&spec.root, root_overlay, staged.is_some())?;
    }
    // The guest's own disk: one VM at a time on it (an earlier runner may still be dying).
    let _disk_lock = match spec
        .root_overlay
        .as_ref()
        .and_then(|o| o.guest_disk.as_ref())
    {
        Some(disk) => Some(
            layer_disk::lock_image(disk)
                .map_err(|e| LaunchError::Overlay(crate::overlay::OverlayError::Image(e)))?,
        ),
        None => None,
    };
    // With a guest disk the mounts are made in their own shared directory, which the guest
    // init binds over its root, with the layer directories (`launch_file`).
    let guest_mounts_dir = spec
        .root_overlay
        .as_ref()
        .and_then(|o| o.guest_mounts_dir());
    match (&guest_mounts_dir, &spec.root_overlay) {
        (Some(dir), _) => {
            std::fs::create_dir(dir)
                .map_err(|e| guest_mounts::io_error("make", dir, e))
                .map_err(crate::overlay::OverlayError::Disk)?;
            guest_mounts::apply(dir, &spec.mounts, guest_mounts::Layer::InGuest)?;
        }
        (None, Some(o)) if o.bounded() => {
            let layer = o
                .disk_dir()
                .map_or(guest_mounts::Layer::None, guest_mounts::Layer::OnHost);
            guest_mounts::apply(&spec.root, &spec.mounts, layer)?;
        }
        _ => guest_mounts::apply(&spec.root, &spec.mounts, guest_mounts::Layer::None)?,
    }
    // TSI makes the guest's sockets ours: from here on they are judged by the policy of a
    // network namespace of our own (loopback is ours, not the host's), where pasta is the
    // only way out. Still single-threaded, as the resolver proxy's fork needs.
    // A root runner (`run_as`: the unprivileged ids pasta runs as) has its namespace belong
    // to those ids, so pasta never runs as root; an ordinary user's runner owns its own.
    if let (Some(setup), Some(pasta)) = (&spec.egress, pasta) {
        let log = "/proc/self/fd/2";
        // A runner that gave root up is in a user namespace its pasta ids own already.
        match setup.run_as.filter(|_| staged.is_none()) {
            Some(owner) => egress::netns::connect_owned_by(pasta, setup, log, owner),
            None => egress::netns::connect(pasta, setup, log),
        }
        .map_err(LaunchError::Egress)?;
    }

    // Every end of the VM then says in runner.log whether the guest reported a status.
    let filter = std::env::var(crate::krun::LOG_FILTER_ENV)
        .unwrap_or_else(|_| crate::krun::DEFAULT_LOG_FILTER.to_string());
    crate::krun::init_log(&filter)?;
    let ctx = Context::new()?;
    for call in krun_calls(spec) {
        make(&ctx, &call)?;
    }

    // libkrun's init reads /.krun_config.json and starts our shim, which reads the launch
    // file; both are overlay entries, so the root directory is never written. They live
    // as long as the process, as libkrun requires.
    let krun_config: &'static [u8] = launch_file::krun_init_config().into_bytes().leak();
    let launch: &'static [u8] = launch_file::encode(spec).leak();
    ctx.add_root_overlay_file("/.krun_config.json", krun_config, 0o444)?;
    ctx.add_root_overlay_file(LAUNCH_PATH, launch, 0o400)?;
    ctx.add_root_overlay_file(INIT_PATH, GUEST_INIT, 0o555)?;

    // Everything is mounted and configured: from here on the runner sees only what it
    // serves, and may make only the system calls libkrun makes.
    own_root::enter(spec)?;
    confine_syscalls()?;

    // One line before the VM runs: a runner that hangs with this line in its log hung in the
    // guest (or libkrun), one without it hung in its own set-up.
    eprintln!(
        "sandbox-libkrun-vm: entering the VM ({} vCPUs, {} MiB)",
        spec.vcpus, spec.memory_mib
    );
    Ok(ctx.start_enter()?)
}

/// Descriptors the runner may hold. libkrun's virtio-fs server keeps one open for every file
/// and directory the guest's kernel holds an inode of (until the guest forgets it), so a guest
/// program that imports a large library (the Python iii-sdk looks up about 800 paths) passes
/// the usual soft limit of 1024 and its opens fail with EMFILE. Bounded, soft and hard alike:
/// each is host kernel memory, and a guest must not make its runner hold more. A sandbox's
/// runner is given a lower bound where its share of the host's `fs.file-max` is smaller
/// (`runner_nofile`).
pub const RUNNER_NOFILE: u64 = 65536;

/// What the runner's RLIMIT_NOFILE is set to: the spec's `runner_nofile`, never above
/// [`RUNNER_NOFILE`].
pub fn runner_nofile(spec: &VmSpec) -> u64 {
    spec.runner_nofile
        .map_or(RUNNER_NOFILE, |limit| limit.min(RUNNER_NOFILE))
}

/// Sets the runner's RLIMIT_NOFILE to `limit`, or where its hard limit is lower and it may
/// not raise it (an ordinary user, whose bound is the host's choice, e.g. systemd's
/// `LimitNOFILE`; a root without CAP_SYS_RESOURCE) to that hard limit; soft and hard equal,
/// so nothing in the runner can raise it later.
fn hold_files_for_the_guest(limit: u64) -> Result<(), LaunchError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(LaunchError::NoFile)?;
    match setrlimit(Resource::RLIMIT_NOFILE, limit, limit) {
        Err(nix::errno::Errno::EPERM) if hard < limit => {
            setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(LaunchError::NoFile)
        }
        done => done.map_err(LaunchError::NoFile),
    }
}

/// What libkrun's devices need of the runner's (own user namespace's) capabilities: its
/// virtio-fs server makes, owns and opens files as the guest's users (switching its ids per
/// request) and sets file capabilities; TSI binds a guest's low ports in the runner's network
/// namespace. Not SYS_ADMIN, NET_ADMIN, SYS_PTRACE or the others: the runner mounts nothing
/// and runs nothing once the VM starts.
const RUNNER_CAPABILITIES: [u32; 10] = [
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    2,  // CAP_DAC_READ_SEARCH
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    10, // CAP_NET_BIND_SERVICE
    27, // CAP_MKNOD
    31, // CAP_SETFCAP
];

/// The runner keeps only [`RUNNER_CAPABILITIES`], sets no_new_privs, then installs its seccomp
/// filter (`seccomp_policy::vmm`); every thread libkrun starts inherits all three.
fn confine_syscalls() -> Result<(), LaunchError> {
    egress::keep_capabilities(&RUNNER_CAPABILITIES).map_err(LaunchError::Seccomp)?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| LaunchError::Seccomp(e.to_string()))?;
    seccomp_policy::vmm::install_runner().map_err(|e| LaunchError::Seccomp(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SpecError;
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> VmSpec {
        let dir = std::env::temp_dir();
        let mut value = json!({
            "vcpus": 2, "memory_mib": 512, "root": dir, "workload": "/agent",
            "shares": [{"tag": "agent", "host_path": dir, "guest_path": "/a", "read_only": true}],
            "vsock": [{"port": 1024, "socket": dir.join("x.sock"), "direction": "host-listens"}],
        });
        if let (Some(value), serde_json::Value::Object(extra)) = (value.as_object_mut(), extra) {
            value.extend(extra);
        }
        VmSpec::from_json(&value.to_string()).unwrap()
    }

    #[test]
    fn the_runner_holds_a_fixed_number_of_files() {
        use nix::sys::resource::{getrlimit, Resource};
        let (_, hard_before) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // Lowering this test process's limit to the runner's harms no other test.
        hold_files_for_the_guest(RUNNER_NOFILE).unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(
            soft, hard,
            "soft and hard alike: nothing in the runner raises it"
        );
        // Its own bound, or a lower hard limit it was not allowed to raise.
        assert!(
            soft == RUNNER_NOFILE || (soft == hard_before && hard_before < RUNNER_NOFILE),
            "{soft} (hard limit before: {hard_before})"
        );
    }

    #[test]
    fn a_sandboxs_share_lowers_the_runners_files_but_never_raises_them() {
        assert_eq!(runner_nofile(&spec(json!({}))), RUNNER_NOFILE);
        let lower = spec(json!({"runner_nofile": 38593}));
        assert_eq!(runner_nofile(&lower), 38593);
        let higher = spec(json!({"runner_nofile": RUNNER_NOFILE * 4}));
        assert_eq!(runner_nofile(&higher), RUNNER_NOFILE);
    }

    #[test]
    fn a_plain_spec_makes_no_tuning_call() {
        let calls = krun_calls(&spec(json!({})));
        assert_eq!(
            calls[0],
            KrunCall::VmConfig {
                vcpus: 2,
                memory_mib: 512
            }
        );
        assert!(calls.contains(&KrunCall::DisableNetworking));
        assert!(!calls.contains(&KrunCall::NestedVirt));
        assert!(!calls.iter().any(|c| matches!(c, KrunCall::Rlimits(_))));
        assert!(calls.iter().any(
            |c| matches!(c, KrunCall::Virtiofs { tag, shm_bytes: 0, read_only: true, .. } if tag == "agent")
        ));
    }

    #[test]
    fn the_tuning_fields_become_their_libkrun_calls() {
        let calls = krun_calls(&spec(json!({
            "nested_virt": true, "virtiofs_shm_size_mib": 256, "nofile_limit": 65536,
            "network": true,
        })));
        assert!(calls.contains(&KrunCall::NestedVirt));
        assert!(!calls.contains(&KrunCall::DisableNetworking));
        assert!(
            calls.contains(&KrunCall::TsiInetOnly),
            "network: TSI for inet sockets only"
        );
        let shares: Vec<u64> = calls
            .iter()
            .filter_map(|c| match c {
                KrunCall::Virtiofs { shm_bytes, .. } => Some(*shm_bytes),
                _ => None,
            })
            .collect();
        assert_eq!(shares, [256 << 20]);
        assert!(calls.contains(&KrunCall::Rlimits(vec!["7=65536:65536".into()])));
        // Nested virtualisation is set before the devices; everything before start.
        let nested = calls.iter().position(|c| *c == KrunCall::NestedVirt);
        assert_eq!(nested, Some(1));
    }

    #[test]
    fn an_inherited_console_is_reopened_through_proc() {
        let calls = krun_calls(&spec(json!({"console_fd": 7})));
        assert!(calls.contains(&KrunCall::ConsoleOutput("/proc/self/fd/7".into())));
        let err = VmSpec::from_json(
            &json!({"vcpus": 1, "memory_mib": 512, "root": "/", "workload": "/a",
                    "console_fd": 0})
            .to_string(),
        );
        assert!(matches!(err, Err(SpecError::BadConsoleFd(0))), "{err:?}");
        let both = VmSpec::from_json(
            &json!({"vcpus": 1, "memory_mib": 512, "root": "/", "workload": "/a",
                    "console_fd": 5, "console_log": "/tmp/c.log"})
            .to_string(),
        );
        assert!(matches!(both, Err(SpecError::TwoConsoles)), "{both:?}");
    }

    #[test]
    fn the_console_descriptor_must_be_open() {
        let (reader, _writer) = std::io::pipe().unwrap();
        use std::os::fd::AsRawFd;
        let fd = reader.as_raw_fd();
        keep_from_children(fd).unwrap();
        // SAFETY: F_GETFD on a descriptor this test owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        drop(reader);
        assert!(keep_from_children(fd).is_err());
    }
}
