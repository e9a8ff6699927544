//! A sandbox's usage for `metrics`, read from the host side only: its cgroups' counters and
//! the kernel's per-process files of the processes the cgroup lists, and the network
//! namespace of the launcher (our own child, which joins the sandbox's network namespace
//! when it has network). Nothing the guest names is opened.
//!
//! - memory: `memory.current` / `memory.peak` (v2), `memory.usage_in_bytes` /
//!   `memory.max_usage_in_bytes` (v1); the layer's tmpfs pages are charged there too.
//! - disk: the layer is a tmpfs in the sandbox's own mount namespace, out of the host's
//!   sight; its pages are the group's `shmem` (`memory.stat`), which also counts the
//!   sandbox's other shared memory (`/dev/shm` lives on the same tmpfs).
//! - cpu: `cpu.stat` `usage_usec` (v2); on v1 the sandbox's groups have no cpuacct, so the
//!   sum of user and system time (with reaped children's) of the processes in the group:
//!   time of a process whose parent died before reaping it is lost.
//! - network: bytes on every interface but loopback; 0 for a sandbox without network
//!   (loopback only).

use std::fs;
use std::path::{Path, PathBuf};

use sandbox_core::{proc_counters, Counters};

pub fn read(dirs: &[PathBuf], launcher: Option<u32>) -> Counters {
    let with = |file: &str| dirs.iter().map(|d| d.join(file)).find(|f| f.is_file());
    let number = |file: &str| {
        with(file).and_then(|f| fs::read_to_string(f).ok()?.trim().parse::<u64>().ok())
    };
    let (memory_bytes, memory_peak_bytes) = if with("memory.current").is_some() {
        (number("memory.current"), number("memory.peak"))
    } else {
        (
            number("memory.usage_in_bytes"),
            number("memory.max_usage_in_bytes"),
        )
    };
    let stat = |file: &str, key: &str| {
        with(file).and_then(|f| stat_value(&fs::read_to_string(f).ok()?, key))
    };
    let cpu_ms = stat("cpu.stat", "usage_usec")
        .map(|us| us / 1000)
        .or_else(|| procs_cpu_ms(dirs.first()?));
    let (net_rx_bytes, net_tx_bytes) = launcher.and_then(proc_counters::net_bytes).unzip();
    Counters {
        cpu_ms,
        memory_bytes,
        memory_peak_bytes,
        disk_bytes: stat("memory.stat", "shmem"),
        pids: number("pids.current"),
        net_rx_bytes,
        net_tx_bytes,
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// User and system time (with reaped children's) of the processes `group` lists.
fn procs_cpu_ms(group: &Path) -> Option<u64> {
    let procs = fs::read_to_string(group.join("cgroup.procs")).ok()?;
    Some(
        procs
            .lines()
            .filter_map(|pid| proc_counters::cpu_ms(pid.trim().parse().ok()?))
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_counter_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let group = dir.path().to_path_buf();
        fs::write(group.join("memory.current"), "4096\n").unwrap();
        fs::write(group.join("memory.peak"), "8192\n").unwrap();
        fs::write(group.join("memory.stat"), "anon 1\nshmem 3000\nfile 7\n").unwrap();
        fs::write(group.join("cpu.stat"), "usage_usec 25000\nuser_usec 1\n").unwrap();
        fs::write(group.join("pids.current"), "3\n").unwrap();
        let counters = read(std::slice::from_ref(&group), None);
        assert_eq!(
            counters,
            Counters {
                cpu_ms: Some(25),
                memory_bytes: Some(4096),
                memory_peak_bytes: Some(8192),
                disk_bytes: Some(3000),
                pids: Some(3),
                net_rx_bytes: None,
                net_tx_bytes: None,
            }
        );
        let v1 = tempfile::tempdir().unwrap();
        let v1 = v1.path().to_path_buf();
        fs::write(v1.join("memory.usage_in_bytes"), "10\n").unwrap();
        fs::write(v1.join("memory.max_usage_in_bytes"), "20\n").unwrap();
        let counters = read(std::slice::from_ref(&v1), None);
        assert_eq!(
            (counters.memory_bytes, counters.memory_peak_bytes),
            (Some(10), Some(20))
        );
        assert_eq!(counters.pids, None, "a missing file is null, not 0");
    }
}
