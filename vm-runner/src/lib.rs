//! vm-runner: boots one libkrun microVM from a JSON specification (the
//! `sandbox-libkrun-vm` binary), and tells whether this host can boot one at all
//! ([`probe::host_can_boot`]).
//!
//! It is not a VM manager: one process runs one VM and exits with the guest workload's
//! status (libkrun's `krun_start_enter` never returns). It knows nothing about sandboxes,
//! images or the agent; `plugin-libkrun` builds the specification and owns the process.
//!
//! | module | concern |
//! | --- | --- |
//! | [`spec`] | the specification and its validation (before any VM call) |
//! | [`probe`] | can this host boot a guest (KVM that is not PVM, libkrunfw present) |
//! | [`launch_file`] | what the guest init shim reads: shares, argv, env, byte for byte |
//! | [`launch`] | configure libkrun from a specification and boot |
//! | `overlay` | the optional writable root (overlay in a private mount namespace) |
//! | `guest_mounts` | the extra mounts (binds, tmpfs, symlinks) made inside the root |
//! | `drop_root` | a root runner becomes root of a user namespace of unprivileged ids before the VM starts |
//! | `own_root` | the runner's root holds only what it serves (shares, sockets, `/dev/kvm`, `/proc`) |
//! | [`capture`] | `--capture-layer`: a running sandbox's upper directory copied for a snapshot |
//! | `krun`, `firmware`, `overlay`, `guest_mounts` | the only `unsafe`: libkrun calls, loading libkrunfw, mounts |
//!
//! The specification (`sandbox-libkrun-vm --spec PATH`, or `--spec -` for stdin):
//!
//! ```json
//! {"vcpus": 1, "memory_mib": 512, "root": "/abs/rootfs",
//!  "root_overlay": {"lower": "/abs/image", "layers": ["/abs/snapshot-layer"],
//!                   "upper": "/abs/disk/upper", "work": "/abs/disk/work", "size_mib": 512},
//!  "shares": [{"tag": "work", "host_path": "/abs/dir", "guest_path": "/work", "read_only": false}],
//!  "mounts": [{"kind": "tmpfs", "guest_path": "/app", "read_only": true},
//!             {"kind": "bind", "host_path": "/abs/f", "guest_path": "/app/f", "read_only": true},
//!             {"kind": "symlink", "target": "f", "guest_path": "/app/g"}],
//!  "vsock": [{"port": 1024, "socket": "/abs/agent.sock", "direction": "guest-listens"}],
//!  "workload": "/sbin/agent", "argv": ["--flag", "a \"quoted\" arg"], "env": {"K": "v"},
//!  "workdir": "/", "console_log": "/abs/console.log", "network": false,
//!  "nested_virt": false, "virtiofs_shm_size_mib": 0, "nofile_limit": 65536}
//! ```
//!
//! `argv` follows `workload` (which is argv\[0\]). Arguments, environment and shares reach
//! the guest through a launch file read by a static init shim (`guest/vm-init.c`) that
//! libkrun's own init starts, never through the kernel command line. `network: false`
//! (default) removes libkrun's TSI, so the guest has only its own loopback; vsock bridges
//! still work. With `network: true`, `egress` (an `egress::network::NetworkSetup`: the
//! nftables ruleset, pasta's arguments, the resolver proxy's set-up) puts the runner, whose
//! sockets TSI makes the guest's, in a network namespace of its own behind that policy before
//! the VM boots; without it TSI uses the namespace the runner was started in. `console_fd` (instead of `console_log`; 1 is our stdout) sends the guest
//! console to a descriptor we inherit, e.g. a pipe our parent reads and keeps within a bound. The guest gets `PATH` and `HOME=/root` unless `env` sets them. The last three
//! fields are worker VMs' tuning (`III_VM_*`): VMX/SVM for the guest, a DAX window per share,
//! and the guest's open-file limit, set by libkrun's init before ours starts. There is no
//! SMT switch: libkrun 1.19.7's `krun_set_vm_config` hard-codes it off. With
//! `root_overlay` (needs root), `root` is only a mount point: the runner mounts the overlay
//! there in a private mount namespace of its own, so the guest writes go to `upper` and the
//! mount dies with the runner. `mounts` are made by the runner inside `root` (after the
//! overlay, in the same private namespace) and reach the guest through the root's virtio-fs
//! share, which crosses mount points; read-only tmpfs directories become read-only last, as
//! bwrap's `--remount-ro` does.
//!
//! Exit codes of the binary: the guest's own status, or [`exit::BAD_SPEC`],
//! [`exit::HOST_UNFIT`], [`exit::VM_FAILED`] when no guest ran.

// The runner itself (libkrun's KVM backend, namespaces, idmapped and overlay mounts, seccomp)
// is Linux-only; on other hosts the crate is the specification and a probe that refuses.
#[cfg(target_os = "linux")]
pub mod capture;
#[cfg(target_os = "linux")]
mod drop_root;
pub mod exit;
#[cfg(target_os = "linux")]
mod firmware;
#[cfg(target_os = "linux")]
mod guest_mounts;
#[cfg(target_os = "linux")]
mod krun;
#[cfg(target_os = "linux")]
pub mod launch;
pub mod launch_file;
#[cfg(target_os = "linux")]
mod overlay;
#[cfg(target_os = "linux")]
mod own_root;
pub mod probe;
pub mod spec;

pub use probe::{host_can_boot, HostUnfit};
pub use spec::{GuestMount, RootOverlay, SpecError, VmSpec};
