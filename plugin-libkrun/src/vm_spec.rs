//! The runner's specification for one sandbox: the overlay root, the agent's read-only share,
//! the agent as the workload dialling back on a vsock port bridged to the layer's socket, and
//! for a worker VM the `III_VM_*` tuning the runner can honour (nested virtualisation, the
//! shares' DAX window, the guest's open-file limit; SMT it cannot: see `VmTuning::status`).

use serde_json::{json, Value};
use vm_runner::spec::{MAX_VCPUS, MIN_MEMORY_MIB};
use vm_runner::{SpecError, VmSpec};

use crate::layout::{agent_in_guest, Layout, AGENT_GUEST_DIR};
use sandbox_core::ops::worker::VmTuning;
use sandbox_core::BootSpec;

/// The vsock port the agent connects to (host CID 2); bridged to `agent.sock`.
pub const AGENT_VSOCK_PORT: u32 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum VmSpecError {
    #[error("libkrun runs at most {MAX_VCPUS} vCPUs, asked {0}")]
    TooManyCpus(u32),
    #[error("the runner would refuse the specification: {0}")]
    Invalid(#[from] SpecError),
}

/// Builds and validates (as the runner will) the specification. Memory below what the guest
/// kernel needs is raised to that minimum. A worker VM's spec (its layer persists: only
/// `worker::*` boots ask for that) carries `tuning`; a sandbox's never does.
pub fn build(
    spec: &BootSpec,
    layout: &Layout,
    tuning: &VmTuning,
) -> Result<(Value, VmSpec), VmSpecError> {
    let vcpus = u8::try_from(spec.cpus)
        .ok()
        .filter(|n| *n <= MAX_VCPUS)
        .ok_or(VmSpecError::TooManyCpus(spec.cpus))?;
    let mut value = json!({
        "vcpus": vcpus,
        "memory_mib": spec.memory_mb.max(MIN_MEMORY_MIB),
        "root": layout.root,
        "root_overlay": {"lower": spec.image_root, "upper": layout.upper, "work": layout.work},
        "shares": [{
            "tag": "iii-agent",
            "host_path": layout.agent_dir,
            "guest_path": AGENT_GUEST_DIR,
            "read_only": true,
        }],
        "vsock": [{
            "port": AGENT_VSOCK_PORT,
            "socket": layout.socket,
            "direction": "host-listens",
        }],
        "workload": agent_in_guest(),
        "argv": ["--vsock-port", AGENT_VSOCK_PORT.to_string()],
        "console_log": layout.console_log,
        "network": spec.network,
    });
    if spec.persistent_layer {
        value["nested_virt"] = tuning.nested_virt.into();
        value["virtiofs_shm_size_mib"] = tuning.virtiofs_shm_size_mib.into();
        value["nofile_limit"] = json!(tuning.nofile_limit);
    }
    let parsed = VmSpec::from_json(&value.to_string())?;
    Ok((value, parsed))
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
        let layout = Layout::new(&spec.layer_dir);
        layout.prepare(&spec.agent_path).unwrap();
        (spec, layout)
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
    fn spec_runs_the_agent_over_the_overlay_root_with_the_requested_resources() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, layout) = boot_spec(dir.path(), 2, 1024);
        let (_, vm) = build(&spec, &layout, &VmTuning::default()).unwrap();
        assert_eq!((vm.vcpus, vm.memory_mib, vm.network), (2, 1024, true));
        assert_eq!(vm.root, layout.root);
        let overlay = vm.root_overlay.unwrap();
        assert_eq!(overlay.lower, spec.image_root);
        assert_eq!(overlay.upper, layout.upper);
        assert_eq!(vm.workload, "/.iii-agent/sandbox-agent");
        assert_eq!(vm.argv, ["--vsock-port", "1024"]);
        assert_eq!(vm.vsock.len(), 1);
        assert_eq!(vm.vsock[0].socket, layout.socket);
        assert!(vm.shares[0].read_only);
        assert_eq!(
            vm.console_log.as_deref(),
            Some(layout.console_log.as_path())
        );
    }

    #[test]
    fn tiny_memory_is_raised_and_too_many_cpus_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, layout) = boot_spec(dir.path(), 1, 16);
        let tuning = VmTuning::default();
        assert_eq!(
            build(&spec, &layout, &tuning).unwrap().1.memory_mib,
            MIN_MEMORY_MIB
        );
        let (mut spec, layout) = (spec, layout);
        spec.cpus = 300;
        assert!(matches!(
            build(&spec, &layout, &tuning),
            Err(VmSpecError::TooManyCpus(300))
        ));
    }

    #[test]
    fn a_worker_vm_gets_the_tuning_and_the_runner_makes_its_calls() {
        use vm_runner::launch::{krun_calls, KrunCall};
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, layout) = boot_spec(dir.path(), 2, 1024);
        spec.persistent_layer = true;
        let (value, vm) = build(&spec, &layout, &tuned()).unwrap();
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
        let (_, vm) = build(&spec, &layout, &quiet).unwrap();
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
        let (value, vm) = build(&spec, &layout, &tuned()).unwrap();
        for field in ["nested_virt", "virtiofs_shm_size_mib", "nofile_limit"] {
            assert!(value.get(field).is_none(), "{field}: {value}");
        }
        assert!(!vm.nested_virt && vm.nofile_limit.is_none());
        assert!(!krun_calls(&vm)
            .iter()
            .any(|c| matches!(c, KrunCall::Rlimits(_) | KrunCall::NestedVirt)));
    }
}
