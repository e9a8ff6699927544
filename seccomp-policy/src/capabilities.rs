//! The other half of confining a process: the capabilities it keeps. The agent keeps Docker's
//! default set but CAP_NET_RAW, the starter's resolver proxy CAP_NET_ADMIN of its gate, the
//! bus forward and the VM runner none, all through [`keep_only`].

// prctl and capset are system calls neither libc's safe wrappers nor nix cover.
#![allow(unsafe_code)]

use std::io;

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// A step of [`keep_only`] the kernel refused.
#[derive(Debug, thiserror::Error)]
#[error("cannot {step}: {source}")]
pub struct CapError {
    pub step: String,
    #[source]
    pub source: io::Error,
}

fn refused(step: impl Into<String>) -> CapError {
    CapError {
        step: step.into(),
        source: io::Error::last_os_error(),
    }
}

/// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`), or 40
/// (Linux 5.9's CAP_CHECKPOINT_RESTORE) where it cannot be read.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .unwrap_or(40)
}

/// Keeps only `keep` (capability numbers below 32) in the calling thread's sets: every other
/// capability up to `last_cap` leaves the bounding set (no exec can regain it), the ambient set
/// is cleared, and effective = permitted = `keep`. Inheritable is left empty, as Docker does
/// since CVE-2022-24769: root's execs get the bounding set anyway, and a non-root program must
/// not pick capabilities up from file inheritable bits. Threads made after inherit it. Returns
/// how many capabilities left the bounding set.
pub fn keep_only(keep: &[u32], last_cap: u32) -> Result<u32, CapError> {
    let mut dropped = 0;
    for cap in (0..=last_cap).filter(|cap| !keep.contains(cap)) {
        // SAFETY: PR_CAPBSET_DROP takes one integer argument, a capability number.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if rc != 0 {
            return Err(refused(format!(
                "drop capability {cap} from the bounding set"
            )));
        }
        dropped += 1;
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
        return Err(refused("clear the ambient capabilities"));
    }
    let mask = keep
        .iter()
        .filter(|cap| **cap < 32)
        .fold(0u32, |mask, cap| mask | (1 << cap));
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: mask,
            permitted: mask,
            inheritable: 0,
        },
        CapData::default(),
    ];
    // SAFETY: version 3 reads one header and two data structs, both valid for the call and
    // laid out as the kernel's (repr(C), three u32s each).
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return Err(refused("set the capabilities (capset)"));
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a thread of its own (capabilities are per thread): CAP_NET_ADMIN alone is kept, the
    /// rest gone from every set, the bounding set included.
    #[test]
    fn only_the_kept_capabilities_remain() {
        if !nix_free_is_root() {
            println!("DID NOT RUN: needs root (capabilities to drop)");
            return;
        }
        std::thread::spawn(|| {
            let last = last_cap();
            let dropped = keep_only(&[12], last).expect("dropped");
            assert_eq!(dropped, last);
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(|value| u64::from_str_radix(value.trim(), 16).unwrap())
                    .unwrap()
            };
            assert_eq!(field("CapEff:"), 1 << 12);
            assert_eq!(field("CapPrm:"), 1 << 12);
            assert_eq!(field("CapBnd:"), 1 << 12);
            assert_eq!(field("CapInh:"), 0);
            assert_eq!(field("CapAmb:"), 0);
        })
        .join()
        .expect("the thread");
    }

    fn nix_free_is_root() -> bool {
        // SAFETY: geteuid has no arguments and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }
}
