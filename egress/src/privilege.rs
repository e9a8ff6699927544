//! What the starter's helper processes keep of their privilege. The resolver proxy and the bus
//! forward are forked from a launcher that is root of the sandbox's outer user namespace (every
//! capability there) and they read what a hostile guest sends: each keeps only the
//! capabilities its work needs (the proxy CAP_NET_ADMIN of the gate, for `nft`; the forward
//! none), with no_new_privs and the sandbox's own seccomp filters, so a helper taken over by
//! its input holds no more than its job.

// prctl and capset are system calls nix does not wrap.
#![allow(unsafe_code)]

use std::io;

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Keeps only `caps` (capability numbers below 32) in every set, the bounding set included
/// (an exec regains nothing), sets no_new_privs and installs the sandbox's seccomp filters.
pub(crate) fn keep_only(caps: &[u32]) -> Result<(), String> {
    keep_capabilities(caps)?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    seccomp_policy::install().map_err(|e| e.to_string())?;
    Ok(())
}

/// Keeps only `caps` (capability numbers below 32) in every set of the calling thread, the
/// bounding set included (an exec regains nothing), ambient cleared. Threads made after
/// inherit it. Also the VM runner's, before its VM starts.
pub fn keep_capabilities(caps: &[u32]) -> Result<(), String> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .unwrap_or(40);
    for cap in (0..=last).filter(|c| !caps.contains(c)) {
        // SAFETY: PR_CAPBSET_DROP takes one integer argument, a capability number.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if rc != 0 {
            return Err(format!(
                "cannot drop capability {cap}: {}",
                io::Error::last_os_error()
            ));
        }
    }
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(format!(
            "cannot clear the ambient capabilities: {}",
            io::Error::last_os_error()
        ));
    }
    let keep = caps
        .iter()
        .filter(|c| **c < 32)
        .fold(0u32, |mask, cap| mask | (1 << cap));
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: keep,
            permitted: keep,
            inheritable: 0,
        },
        CapData::default(),
    ];
    // SAFETY: version 3 reads one header and two data structs, both valid for the call and
    // laid out as the kernel's (repr(C), three u32s each).
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return Err(format!("capset: {}", io::Error::last_os_error()));
    }
    Ok(())
}
