//! Exit statuses of `sandbox-libkrun-vm` when no guest workload ran. Any other status is the
//! workload's own.

/// The specification was refused (before any VM call).
pub const BAD_SPEC: i32 = 2;
/// The host cannot boot microVMs (see [`crate::probe::HostUnfit`]).
pub const HOST_UNFIT: i32 = 3;
/// libkrun refused the configuration or failed to start the VM.
pub const VM_FAILED: i32 = 125;
