//! Capability sets as `/proc/PID/status` gives them (hex masks), as names.

/// The kernel's capability names by number (`include/uapi/linux/capability.h`).
const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

pub const CAP_SYS_PTRACE: u32 = 19;

pub fn name(bit: u32) -> String {
    NAMES
        .get(bit as usize)
        .map_or_else(|| format!("CAP_{bit}"), |n| n.to_string())
}

/// Every capability this kernel has (`/proc/sys/kernel/cap_last_cap`).
pub fn full_mask() -> u64 {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(NAMES.len() as u32 - 1);
    if last >= 63 {
        u64::MAX
    } else {
        (1u64 << (last + 1)) - 1
    }
}

/// A set as the table writes it: `[]` for none, `["all"]` for every capability of this
/// kernel, `["all", "-CAP_X", ...]` when at most a few are missing (a bounding set), else the
/// names. Independent of how many capabilities the kernel has.
pub fn describe(mask: u64, full: u64) -> Vec<String> {
    let mask = mask & full;
    if mask == 0 {
        return Vec::new();
    }
    let missing = full & !mask;
    if missing.count_ones() <= 8 && mask.count_ones() > missing.count_ones() {
        let mut out = vec!["all".to_string()];
        out.extend(bits(missing).map(|b| format!("-{}", name(b))));
        return out;
    }
    bits(mask).map(name).collect()
}

fn bits(mask: u64) -> impl Iterator<Item = u32> {
    (0..64).filter(move |b| mask & (1u64 << b) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_named_whatever_the_kernel_adds() {
        let full = (1u64 << 41) - 1;
        assert_eq!(describe(0, full), Vec::<String>::new());
        assert_eq!(describe(full, full), ["all"]);
        assert_eq!(describe(full & !(1 << 21), full), ["all", "-CAP_SYS_ADMIN"]);
        assert_eq!(
            describe((1 << 0) | (1 << 13), full),
            ["CAP_CHOWN", "CAP_NET_RAW"]
        );
        // A kernel with one more capability than we name.
        let newer = (1u64 << 42) - 1;
        assert_eq!(describe(newer & !(1 << 41), newer), ["all", "-CAP_41"]);
    }
}
