//! The runner's specification for one sandbox: the overlay root, the agent's read-only share,
//! the agent as the workload dialling back on a vsock port bridged to the layer's socket, and
//! for a worker VM the `III_VM_*` tuning the runner can honour (nested virtualisation, the
//! shares' DAX window, the guest's open-file limit; SMT it cannot: see `VmTuning::status`).

use serde_json::{json, Value};
use vm_runner::spec::{MAX_VCPUS, MIN_MEMORY_MIB};
use vm_runner::{SpecError, VmSpec};

use egress::network::NetworkSetup;

use crate::layout::{agent_in_guest, Layout, AGENT_GUEST_DIR};
use sandbox_core::ops::worker::VmTuning;
use sandbox_core::{BootSpec, GuestMount};

/// Where the runner sends the guest console: its stdout.
pub const CONSOLE_FD: i32 = 1;

/// The vsock port the agent connects to (host CID 2); bridged to `agent.sock`.
pub const AGENT_VSOCK_PORT: u32 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum VmSpecError {
    #[error("libkrun runs at most {MAX_VCPUS} vCPUs, asked {0}")]
    TooManyCpus(u32),
    #[error(
        "the symbolic link at {0} has a target that is not UTF-8, which the VM runner cannot carry"
    )]
    SymlinkTarget(String),
    #[error("the runner would refuse the specification: {0}")]
    Invalid(#[from] SpecError),
}

/// Builds and validates (as the runner will) the specification. Memory below what the guest
/// kernel needs is raised to that minimum. A worker VM's spec (its layer persists: only
/// `worker::*` boots ask for that) carries `tuning`; a sandbox's never does. `drop_root`: a
/// root adapter's subordinate uid and gid base, for which its runner gives host root up.
pub fn build(
    spec: &BootSpec,
    layout: &Layout,
    tuning: &VmTuning,
    egress: Option<&NetworkSetup>,
    drop_root: Option<(u32, u32)>,
    runner_files: u64,
) -> Result<(Value, VmSpec), VmSpecError> {
    let vcpus = u8::try_from(spec.cpus)
        .ok()
        .filter(|n| *n <= MAX_VCPUS)
        .ok_or(VmSpecError::TooManyCpus(spec.cpus))?;
    let mounts = spec
        .mounts
        .iter()
        .map(|mount| runner_mount(mount, layout, &spec.sandbox_id))
        .collect::<Result<Vec<_>, _>>()?;
    let mut value = json!({
        "vcpus": vcpus,
        "memory_mib": spec.memory_mb.max(MIN_MEMORY_MIB),
        "root": layout.root,
        // A sandbox's writes go to a tmpfs of its disk_mb (ENOSPC past it, nothing on the
        // host's disk); a worker VM's persistent layer to its ext4 image of disk_mb (root
        // adapter), else to a directory of its layer, unbounded.
        "root_overlay": {
            "lower": spec.image_root,
            // A snapshot's layers, read-only over the image (a sandbox's only).
            "layers": spec.snapshot_layers,
            "upper": layout.upper,
            "work": layout.work,
            "size_mib": if layout.guest_disk.is_some() {
                Some(GUEST_DISK_HOST_TMPFS_MIB)
            } else {
                (!layout.persistent).then_some(spec.disk_mb)
            },
            "image": layout.image,
            "guest_disk": layout.guest_disk,
        },
        "shares": [{
            "tag": "iii-agent",
            "host_path": layout.agent_dir,
            "guest_path": AGENT_GUEST_DIR,
            "read_only": true,
        }],
        "mounts": mounts,
        "vsock": [{
            "port": AGENT_VSOCK_PORT,
            "socket": layout.socket,
            "direction": "host-listens",
        }],
        "workload": agent_in_guest(),
        // Confined like on bwrap: the guest's own kernel knobs read-only, Docker's
        // capabilities, seccomp (the VM is the boundary; this is depth).
        "argv": ["--confine", "--vsock-port", AGENT_VSOCK_PORT.to_string()],
        // The runner's stdout: a pipe the backend keeps within a bound (the `bounded-log` crate).
        "console_fd": CONSOLE_FD,
        // TSI only behind the egress policy (a sandbox with network, every worker VM): the
        // runner's sockets, which TSI makes the guest's, are then in a namespace of its own
        // where the policy judges them; a worker VM's bus is the engine's one port that pasta
        // forwards from that namespace's loopback to the VM's endpoint of the bus guard.
        "network": false,
    });
    if let Some(setup) = egress {
        value["network"] = true.into();
        value["egress"] = serde_json::to_value(setup).map_err(SpecError::Parse)?;
        value["mounts"]
            .as_array_mut()
            .expect("mounts is an array")
            .push(json!({
                "kind": "bind",
                "host_path": layout.resolv_conf,
                "guest_path": "/etc/resolv.conf",
                "read_only": true,
            }));
    }
    // A root adapter's runner gives host root up before the VM starts, for the sandbox ids
    // bwrap's root launcher gives its sandboxes (the adapter's subordinate range).
    if let Some((uid, gid)) = drop_root {
        value["drop_root"] = json!({
            "uid": uid,
            "gid": gid,
            "count": sandbox_core::subordinate::RANGE,
            "layer": layout.dir,
        });
    }
    // A sandbox's runner holds its share of the host's open files; a worker VM's keeps the
    // runner's own bound (worker VMs are not counted against max_concurrent_sandboxes).
    if !spec.persistent_layer {
        value["runner_nofile"] = runner_files.into();
    }
    if spec.persistent_layer {
        value["nested_virt"] = tuning.nested_virt.into();
        value["virtiofs_shm_size_mib"] = tuning.virtiofs_shm_size_mib.into();
        value["nofile_limit"] = json!(tuning.nofile_limit);
    }
    let parsed = VmSpec::from_json(&value.to_string())?;
    Ok((value, parsed))
}

/// The directory of a worker VM's layer image that holds its `/state`.
pub const STATE_LAYER_DIR: &str = "state";

/// With a guest disk, the runner's host-side tmpfs holds only its mount points (the guest's
/// writes go to the disk): a small bound.
pub const GUEST_DISK_HOST_TMPFS_MIB: u32 = 16;

/// One of the sandbox's mounts as the runner's `mounts` entry (made inside the root on the
/// host side, seen by the guest through the root share).
fn runner_mount(
    mount: &GuestMount,
    layout: &Layout,
    sandbox_id: &str,
) -> Result<Value, VmSpecError> {
    Ok(match mount {
        // A worker VM's `/state` shares its layer image's bound (root adapter), beside its
        // root's changes, unless its host directory holds files from before.
        GuestMount::State { host, guest }
            if layout.layer_image().is_some()
                && sandbox_core::state_in_layer_image(host, sandbox_id) =>
        {
            json!({
                "kind": "layer-dir",
                "name": STATE_LAYER_DIR,
                "guest_path": guest,
            })
        }
        GuestMount::Bind(bind) => json!({
            "kind": "bind",
            "host_path": bind.host,
            "guest_path": bind.guest,
            "read_only": bind.read_only,
        }),
        GuestMount::State { host, guest } => json!({
            "kind": "bind",
            "host_path": host,
            "guest_path": guest,
            "read_only": false,
        }),
        GuestMount::Tmpfs { guest, read_only } => json!({
            "kind": "tmpfs",
            "guest_path": guest,
            "read_only": read_only,
        }),
        GuestMount::Symlink { target, guest } => json!({
            "kind": "symlink",
            "target": target
                .to_str()
                .ok_or_else(|| VmSpecError::SymlinkTarget(guest.clone()))?,
            "guest_path": guest,
        }),
    })
}

/// A sandbox's boot spec over `dir` for unit tests: an empty image root and layer, a stand-in
/// agent file, 1 cpu, 256 MiB, no network.
#[cfg(test)]
pub(crate) fn test_boot_spec(dir: &std::path::Path) -> BootSpec {
    let image = dir.join("image");
    let layer = dir.join("layer");
    std::fs::create_dir_all(&image).unwrap();
    std::fs::create_dir_all(&layer).unwrap();
    let agent = dir.join("agent-bin");
    std::fs::write(&agent, b"agent").unwrap();
    BootSpec {
        sandbox_id: "test".into(),
        image_root: image,
        layer_dir: layer,
        cpus: 1,
        memory_mb: 256,
        pids: 1024,
        disk_mb: 1024,
        network: false,
        egress: Default::default(),
        agent_path: agent,
        mounts: Vec::new(),
        persistent_layer: false,
        snapshot_layers: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn boot_spec(dir: &Path, cpus: u32, memory_mb: u32) -> (BootSpec, Layout) {
        let spec = BootSpec {
            cpus,
            memory_mb,
            network: true,
            egress: Default::default(),
            ..test_boot_spec(dir)
        };
        let layout = Layout::new(&spec.layer_dir, spec.persistent_layer);
        layout.prepare(&spec.agent_path).unwrap();
        (spec, layout)
    }

    /// A sandbox runner's share of the host's open files in these tests.
    const FILES: u64 = 38_593;

    #[test]
    fn a_sandboxs_runner_carries_its_share_of_open_files_and_a_workers_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, layout) = boot_spec(dir.path(), 1, 512);
        let (value, vm) = build(&spec, &layout, &VmTuning::default(), None, None, FILES).unwrap();
        assert_eq!(value["runner_nofile"], FILES);
        assert_eq!(vm.runner_nofile, Some(FILES));
        assert_eq!(vm_runner::launch::runner_nofile(&vm), FILES);
        spec.persistent_layer = true;
        let (value, vm) = build(&spec, &layout, &VmTuning::default(), None, None, FILES).unwrap();
        assert!(value.get("runner_nofile").is_none(), "{value}");
        assert_eq!(
            vm_runner::launch::runner_nofile(&vm),
            vm_runner::launch::RUNNER_NOFILE
        );
    }

    fn tuned() -> VmTuning {
        VmTuning {
            hyperthreading: true,
            nested_virt: true,
            virtiofs_shm_size_mib: 256,
            nofile_limit: Some(4096),
        }
    }

    #[test]
    fn a_root_adapters_runner_is_told_which_ids_to_give_root_up_for() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, layout) = boot_spec(dir.path(), 1, 512);
        let (_, vm) = build(&spec, &layout, &VmTuning::default(), None, None, FILES).unwrap();
        assert_eq!(
            vm.drop_root, None,
            "an ordinary user's runner has no root to drop"
        );
        let base = 2_000_000_000;
        let (_, vm) = build(
            &spec,
            &layout,
            &VmTuning::default(),
            None,
            Some((base, base + 7)),
            FILES,
        )
        .unwrap();
        let drop = vm.drop_root.expect("a root adapter's runner drops root");
        assert_eq!((drop.uid, drop.gid), (base, base + 7));
        assert_eq!(drop.count, sandbox_core::subordinate::RANGE);
        assert_eq!(drop.layer, layout.dir);
    }

    #[test]
    fn spec_runs_the_agent_over_the_overlay_root_with_the_requested_resources() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, layout) = boot_spec(dir.path(), 2, 1024);
        let (_, vm) = build(&spec, &layout, &VmTuning::default(), None, None, FILES).unwrap();
        // Never TSI, even for a spec asking for network (the backend refuses that first).
        assert_eq!((vm.vcpus, vm.memory_mib, vm.network), (2, 1024, false));
        assert_eq!(vm.root, layout.root);
        let overlay = vm.root_overlay.unwrap();
        assert_eq!(overlay.lower, spec.image_root);
        assert_eq!(overlay.upper, layout.upper);
        // A sandbox's writes are bounded by a tmpfs of its disk_mb.
        assert_eq!(overlay.size_mib, Some(spec.disk_mb));
        assert_eq!(overlay.disk_dir(), layout.disk.as_deref());
        assert_eq!(vm.workload, "/.iii-agent/sandbox-agent");
        assert_eq!(vm.argv, ["--confine", "--vsock-port", "1024"]);
        assert_eq!(vm.vsock.len(), 1);
        assert_eq!(vm.vsock[0].socket, layout.socket);
        assert!(vm.shares[0].read_only);
        assert_eq!((vm.console_fd, vm.console_log), (Some(CONSOLE_FD), None));
    }

    #[test]
    fn tiny_memory_is_raised_and_too_many_cpus_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, layout) = boot_spec(dir.path(), 1, 16);
        let tuning = VmTuning::default();
        assert_eq!(
            build(&spec, &layout, &tuning, None, None, FILES)
                .unwrap()
                .1
                .memory_mib,
            MIN_MEMORY_MIB
        );
        let (mut spec, layout) = (spec, layout);
        spec.cpus = 300;
        assert!(matches!(
            build(&spec, &layout, &tuning, None, None, FILES),
            Err(VmSpecError::TooManyCpus(300))
        ));
    }

    #[test]
    fn a_worker_vm_has_no_vsock_way_but_the_agents_own_and_no_tsi_without_egress() {
        // The bus is pasta's forwarded port behind TSI (see `egress_for`), never a vsock
        // port of its own: one vsock link (the agent's) for sandboxes and worker VMs alike.
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, _) = boot_spec(dir.path(), 1, 512);
        spec.egress.bus = Some("127.0.0.1:49134".parse().unwrap());
        spec.persistent_layer = true;
        let layout = Layout::new(&spec.layer_dir, true);
        layout.prepare(&spec.agent_path).unwrap();
        let (value, vm) = build(&spec, &layout, &VmTuning::default(), None, None, FILES).unwrap();
        assert!(!vm.network, "no TSI without the egress policy: {value}");
        let overlay = vm.root_overlay.as_ref().unwrap();
        assert_eq!(
            overlay.size_mib, None,
            "a worker VM's layer persists: no tmpfs"
        );
        assert_eq!(overlay.upper, spec.layer_dir.join("upper"));
        assert_eq!(vm.vsock.len(), 1, "{value}");
        assert_eq!(value["vsock"][0]["port"], AGENT_VSOCK_PORT);
        assert_eq!(value["argv"], json!(["--confine", "--vsock-port", "1024"]));
    }

    #[test]
    fn a_sandbox_with_egress_gets_tsi_only_behind_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, layout) = boot_spec(dir.path(), 1, 512);
        std::fs::write(&layout.resolv_conf, egress::network::resolv_conf()).unwrap();
        let host_addrs = vec!["192.0.2.1".parse().unwrap()];
        let setup = NetworkSetup::new(
            "/usr/sbin/nft".into(),
            "/usr/bin/pasta".into(),
            &spec.egress,
            &host_addrs,
            None,
            egress::network::Boundary::Starter,
        );
        let (value, vm) = build(
            &spec,
            &layout,
            &VmTuning::default(),
            Some(&setup),
            None,
            FILES,
        )
        .unwrap();
        assert!(vm.network, "TSI: {value}");
        assert_eq!(vm.egress.as_ref(), Some(&setup), "{value}");
        assert!(
            setup.rules.contains("192.0.2.1"),
            "the host's own addresses are denied: {}",
            setup.rules
        );
        let resolv = vm
            .mounts
            .iter()
            .find(|m| m.guest_path() == "/etc/resolv.conf")
            .unwrap_or_else(|| panic!("the resolver file is bound: {value}"));
        assert!(
            matches!(
                resolv,
                vm_runner::spec::GuestMount::Bind {
                    read_only: true,
                    ..
                }
            ),
            "{value}"
        );

        let (value, vm) = build(&spec, &layout, &VmTuning::default(), None, None, FILES).unwrap();
        assert!(
            !vm.network && vm.egress.is_none(),
            "no TSI without: {value}"
        );
    }

    #[test]
    fn a_worker_vm_gets_the_tuning_and_the_runner_makes_its_calls() {
        use vm_runner::launch::{krun_calls, KrunCall};
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, layout) = boot_spec(dir.path(), 2, 1024);
        spec.persistent_layer = true;
        let (value, vm) = build(&spec, &layout, &tuned(), None, None, FILES).unwrap();
        assert!(vm.nested_virt);
        assert_eq!(vm.virtiofs_shm_size_mib, 256);
        assert_eq!(vm.nofile_limit, Some(4096));
        assert!(
            value.get("hyperthreading").is_none(),
            "no SMT switch exists"
        );
        let calls = krun_calls(&vm);
        assert!(calls.contains(&KrunCall::NestedVirt), "{calls:?}");
        assert!(calls.contains(&KrunCall::Rlimits(vec!["7=4096:4096".into()])));
        assert!(calls.iter().all(|c| match c {
            KrunCall::Virtiofs { shm_bytes, .. } => *shm_bytes == 256 << 20,
            _ => true,
        }));
        // III_VM_NOFILE_LIMIT=0 leaves the limit to the guest's init: no call.
        let quiet = VmTuning {
            nofile_limit: None,
            ..VmTuning::default()
        };
        let (_, vm) = build(&spec, &layout, &quiet, None, None, FILES).unwrap();
        assert_eq!(vm.nofile_limit, None);
        assert!(!krun_calls(&vm)
            .iter()
            .any(|c| matches!(c, KrunCall::Rlimits(_) | KrunCall::NestedVirt)));
    }

    #[test]
    fn a_sandbox_never_gets_the_tuning() {
        use vm_runner::launch::{krun_calls, KrunCall};
        let dir = tempfile::tempdir().unwrap();
        let (spec, layout) = boot_spec(dir.path(), 1, 512);
        let (value, vm) = build(&spec, &layout, &tuned(), None, None, FILES).unwrap();
        for field in ["nested_virt", "virtiofs_shm_size_mib", "nofile_limit"] {
            assert!(value.get(field).is_none(), "{field}: {value}");
        }
        assert!(!vm.nested_virt && vm.nofile_limit.is_none());
        assert!(!krun_calls(&vm)
            .iter()
            .any(|c| matches!(c, KrunCall::Rlimits(_) | KrunCall::NestedVirt)));
    }

    #[test]
    fn worker_mounts_reach_the_runner_in_order() {
        use sandbox_core::Mount;
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, layout) = boot_spec(dir.path(), 1, 256);
        let file = dir.path().join("app.txt");
        std::fs::write(&file, b"x").unwrap();
        spec.mounts = vec![
            GuestMount::Tmpfs {
                guest: "/worker".into(),
                read_only: true,
            },
            GuestMount::Bind(Mount {
                host: file.clone(),
                guest: "/worker/app.txt".into(),
                read_only: true,
            }),
            GuestMount::Symlink {
                target: "app.txt".into(),
                guest: "/worker/link".into(),
            },
            GuestMount::State {
                host: dir.path().to_path_buf(),
                guest: "/state".into(),
            },
        ];
        spec.persistent_layer = true;
        let (_, vm) = build(&spec, &layout, &VmTuning::default(), None, None, FILES).unwrap();
        assert_eq!(
            vm.mounts,
            vec![
                vm_runner::GuestMount::Tmpfs {
                    guest_path: "/worker".into(),
                    read_only: true
                },
                vm_runner::GuestMount::Bind {
                    host_path: file,
                    guest_path: "/worker/app.txt".into(),
                    read_only: true
                },
                vm_runner::GuestMount::Symlink {
                    target: "app.txt".into(),
                    guest_path: "/worker/link".into()
                },
                vm_runner::GuestMount::Bind {
                    host_path: dir.path().to_path_buf(),
                    guest_path: "/state".into(),
                    read_only: false
                },
            ]
        );
    }

    #[test]
    fn a_workers_state_goes_into_its_layer_image_unless_its_host_directory_holds_files() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, _) = boot_spec(dir.path(), 1, 256);
        spec.persistent_layer = true;
        let layout = Layout::new(&spec.layer_dir, true).with_image(&spec.layer_dir);
        layout.prepare(&spec.agent_path).unwrap();
        std::fs::write(spec.layer_dir.join(layer_disk::IMAGE_FILE), b"").unwrap();
        let host = dir.path().join("data");
        spec.mounts = vec![GuestMount::State {
            host: host.clone(),
            guest: "/state".into(),
        }];
        let runner_mounts = |layout: &Layout| {
            build(&spec, layout, &VmTuning::default(), None, None, FILES)
                .unwrap()
                .1
                .mounts
        };
        let in_image = vec![vm_runner::GuestMount::LayerDir {
            name: STATE_LAYER_DIR.into(),
            guest_path: "/state".into(),
        }];
        assert_eq!(runner_mounts(&layout), in_image, "no host directory yet");
        std::fs::create_dir(&host).unwrap();
        assert_eq!(runner_mounts(&layout), in_image, "an empty one");
        std::fs::write(host.join("old"), b"x").unwrap();
        let on_host = vec![vm_runner::GuestMount::Bind {
            host_path: host.clone(),
            guest_path: "/state".into(),
            read_only: false,
        }];
        assert_eq!(runner_mounts(&layout), on_host, "files from before stay");
        // No image (an ordinary user's adapter): the host directory.
        std::fs::remove_file(host.join("old")).unwrap();
        let plain = Layout::new(&spec.layer_dir, true);
        plain.prepare(&spec.agent_path).unwrap();
        assert_eq!(runner_mounts(&plain), on_host);
    }

    #[test]
    fn a_mount_the_runner_would_refuse_is_refused_here() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, layout) = boot_spec(dir.path(), 1, 256);
        spec.mounts = vec![GuestMount::Tmpfs {
            guest: "/worker/../etc".into(),
            read_only: false,
        }];
        assert!(matches!(
            build(&spec, &layout, &VmTuning::default(), None, None, FILES),
            Err(VmSpecError::Invalid(SpecError::BadMountPath { .. }))
        ));
    }
}
