//! A safe wrapper over the few libkrun calls the runner makes. All of the crate's `unsafe`
//! lives here and in `firmware.rs`.

use std::convert::Infallible;
use std::ffi::{CString, NulError};

/// What libkrun logs to the runner's stderr (its `runner.log`) unless
/// `SANDBOX_LIBKRUN_VM_LOG` says otherwise: warnings, and `krun_vmm`'s debug lines, which are
/// two per boot and say how the VM ended ("using vmm exit code": the guest's init reported
/// a status; "using vcpu exit code": it stopped without one: a reset, halt or kernel panic).
pub const DEFAULT_LOG_FILTER: &str = "warn,krun_vmm=debug";
/// Overrides [`DEFAULT_LOG_FILTER`] (an `env_logger` filter).
pub const LOG_FILTER_ENV: &str = "SANDBOX_LIBKRUN_VM_LOG";

/// Sends libkrun's log to stderr with `filter`. Call once, before libkrun starts a thread
/// (it reads the filter from `RUST_LOG`, which is set here for that reason).
pub fn init_log(filter: &str) -> Result<(), KrunError> {
    std::env::set_var("RUST_LOG", filter);
    const STDERR: i32 = 2;
    const LEVEL_WARN: u32 = 2;
    const STYLE_NEVER: u32 = 2;
    // SAFETY: stderr is open for the process's life; libkrun takes it as its log target and
    // keeps no pointer of ours.
    check("krun_init_log", unsafe {
        krun::krun_init_log(STDERR, LEVEL_WARN, STYLE_NEVER, 0)
    })
}

/// A libkrun call that failed.
#[derive(Debug, thiserror::Error)]
pub enum KrunError {
    #[error("libkrun {call} failed: {source}")]
    Call {
        call: &'static str,
        source: std::io::Error,
    },
    #[error("a string passed to libkrun {call} holds a NUL byte")]
    Nul {
        call: &'static str,
        source: NulError,
    },
}

fn check(call: &'static str, ret: i32) -> Result<(), KrunError> {
    if ret < 0 {
        return Err(KrunError::Call {
            call,
            source: std::io::Error::from_raw_os_error(-ret),
        });
    }
    Ok(())
}

fn c_string(call: &'static str, text: &str) -> Result<CString, KrunError> {
    CString::new(text).map_err(|source| KrunError::Nul { call, source })
}

/// `KRUN_TSI_HIJACK_INET` of libkrun's C API (`krun_add_vsock`'s `tsi_features`).
const TSI_HIJACK_INET: u32 = 1 << 0;

/// One libkrun configuration context.
pub struct Context {
    id: u32,
}

impl Context {
    pub fn new() -> Result<Self, KrunError> {
        let ret = krun::krun_create_ctx();
        check("krun_create_ctx", ret)?;
        Ok(Self { id: ret as u32 })
    }

    pub fn set_vm_config(&self, vcpus: u8, memory_mib: u32) -> Result<(), KrunError> {
        check(
            "krun_set_vm_config",
            krun::krun_set_vm_config(self.id, vcpus, memory_mib),
        )
    }

    pub fn set_root(&self, root: &str) -> Result<(), KrunError> {
        let root = c_string("krun_set_root", root)?;
        // SAFETY: `root` is a valid NUL-terminated string that outlives the call; libkrun
        // copies it.
        check("krun_set_root", unsafe {
            krun::krun_set_root(self.id, root.as_ptr())
        })
    }

    /// A virtio-fs share; `shm_bytes` is its DAX window (0: none).
    pub fn add_virtiofs(
        &self,
        tag: &str,
        path: &str,
        shm_bytes: u64,
        read_only: bool,
    ) -> Result<(), KrunError> {
        let tag = c_string("krun_add_virtiofs3", tag)?;
        let path = c_string("krun_add_virtiofs3", path)?;
        // SAFETY: both strings are valid and NUL-terminated for the call; libkrun copies them.
        check("krun_add_virtiofs3", unsafe {
            krun::krun_add_virtiofs3(self.id, tag.as_ptr(), path.as_ptr(), shm_bytes, read_only)
        })
    }

    /// A raw disk image as a virtio-blk device of the guest (`vda` for the first).
    pub fn add_disk(&self, block_id: &str, path: &str) -> Result<(), KrunError> {
        let id = c_string("krun_add_disk", block_id)?;
        let path = c_string("krun_add_disk", path)?;
        // SAFETY: both strings are valid and NUL-terminated for the call; libkrun copies them.
        check("krun_add_disk", unsafe {
            krun::krun_add_disk(self.id, id.as_ptr(), path.as_ptr(), false)
        })
    }

    /// Offers the guest the host's virtualisation extensions (x86_64: VMX/SVM in its CPUID,
    /// where the host's KVM has them).
    pub fn set_nested_virt(&self, enabled: bool) -> Result<(), KrunError> {
        // SAFETY: takes no pointer; declared `unsafe` by libkrun only.
        check("krun_set_nested_virt", unsafe {
            krun::krun_set_nested_virt(self.id, enabled)
        })
    }

    /// Resource limits libkrun's init sets before it starts the workload, each
    /// `"<resource number>=<soft>:<hard>"` (the guest's numbering).
    pub fn set_rlimits(&self, limits: &[String]) -> Result<(), KrunError> {
        let limits: Vec<CString> = limits
            .iter()
            .map(|l| c_string("krun_set_rlimits", l))
            .collect::<Result<_, _>>()?;
        // libkrun views the array as MAX_ARGS (4096) pointers and stops at the first null:
        // give it that many, so the whole view is ours.
        let mut array = vec![std::ptr::null::<std::ffi::c_char>(); 4096];
        for (slot, limit) in array.iter_mut().zip(&limits) {
            *slot = limit.as_ptr();
        }
        // SAFETY: `array` holds 4096 pointers, null after the last limit; each limit is a
        // valid NUL-terminated string outliving the call; libkrun copies them.
        check("krun_set_rlimits", unsafe {
            krun::krun_set_rlimits(self.id, array.as_ptr())
        })
    }

    /// Adds a file to the root filesystem's overlay (the root directory is not touched).
    pub fn add_root_overlay_file(
        &self,
        guest_path: &str,
        data: &'static [u8],
        mode: u32,
    ) -> Result<(), KrunError> {
        let tag = c_string("krun_fs_add_overlay_file", "/dev/root")?;
        let path = c_string("krun_fs_add_overlay_file", guest_path)?;
        // SAFETY: the strings are valid for the call (copied by libkrun); `data` is
        // 'static, so it stays valid for the VM's lifetime as libkrun requires.
        check("krun_fs_add_overlay_file", unsafe {
            krun::krun_fs_add_overlay_file(
                self.id,
                tag.as_ptr(),
                path.as_ptr(),
                data.as_ptr(),
                data.len(),
                mode,
                false,
            )
        })
    }

    /// Replaces libkrun's implicit vsock device (which hijacks the guest's inet sockets
    /// through TSI) with one that only carries the explicitly bridged ports.
    pub fn disable_networking(&self) -> Result<(), KrunError> {
        self.explicit_vsock(0)
    }

    /// Replaces libkrun's implicit vsock device with one whose TSI hijacks the guest's inet
    /// sockets only: never its unix sockets (`KRUN_TSI_HIJACK_UNIX` would let the guest reach
    /// the runner's unix sockets by path), whatever a later libkrun's default.
    pub fn tsi_inet_only(&self) -> Result<(), KrunError> {
        self.explicit_vsock(TSI_HIJACK_INET)
    }

    fn explicit_vsock(&self, tsi_features: u32) -> Result<(), KrunError> {
        check(
            "krun_disable_implicit_vsock",
            krun::krun_disable_implicit_vsock(self.id),
        )?;
        check(
            "krun_add_vsock",
            krun::krun_add_vsock(self.id, tsi_features),
        )
    }

    /// Bridges a guest vsock port to a host unix socket. With `guest_listens`, libkrun
    /// creates and listens on `socket`; otherwise it connects to `socket` when the guest
    /// connects to the port.
    pub fn add_vsock_port(
        &self,
        port: u32,
        socket: &str,
        guest_listens: bool,
    ) -> Result<(), KrunError> {
        let socket = c_string("krun_add_vsock_port2", socket)?;
        // SAFETY: `socket` is valid and NUL-terminated for the call; libkrun copies it.
        check("krun_add_vsock_port2", unsafe {
            krun::krun_add_vsock_port2(self.id, port, socket.as_ptr(), guest_listens)
        })
    }

    pub fn set_console_output(&self, file: &str) -> Result<(), KrunError> {
        let file = c_string("krun_set_console_output", file)?;
        // SAFETY: `file` is valid and NUL-terminated for the call; libkrun copies it.
        check("krun_set_console_output", unsafe {
            krun::krun_set_console_output(self.id, file.as_ptr())
        })
    }

    /// Boots the VM. On success libkrun never returns: it exits the process with the
    /// guest workload's exit status.
    pub fn start_enter(self) -> Result<Infallible, KrunError> {
        let ret = krun::krun_start_enter(self.id);
        check("krun_start_enter", ret)?;
        Err(KrunError::Call {
            call: "krun_start_enter",
            source: std::io::Error::other("returned without error but the VM is not running"),
        })
    }
}
