//! A host process's usage as the kernel's `/proc/<pid>` files keep it, for `metrics`: its CPU
//! time, its resident memory, and the byte counters of the network namespace it is in. Read
//! from the host side only, of processes the adapter started; nothing a guest names is opened.

use std::fs;

/// Clock ticks a second of `/proc/<pid>/stat`'s times (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: u64 = 100;

/// User and system time of `pid`, all its threads, and of its reaped children, in
/// milliseconds; `None` once it is gone.
pub fn cpu_ms(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the name (which may hold spaces and parentheses): state(0) ... utime(11),
    // stime(12), cutime(13), cstime(14).
    let ticks: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Some(ticks * 1000 / TICKS_PER_SECOND)
}

/// Resident memory of `pid` now and at its peak (`VmRSS`, `VmHWM`), in bytes.
pub fn resident_bytes(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status.lines().find_map(|line| {
            let value = line.strip_prefix(key)?.strip_prefix(':')?;
            value.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()
        })
    };
    Some((kib("VmRSS")? * 1024, kib("VmHWM")? * 1024))
}

/// Received and sent bytes on the interfaces (loopback aside) of the network namespace `pid`
/// is in; `(0, 0)` while that is the adapter's own (the sandbox has no network of its own to
/// count).
pub fn net_bytes(pid: u32) -> Option<(u64, u64)> {
    let theirs = fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let ours = fs::read_link("/proc/self/ns/net").ok()?;
    if theirs == ours {
        return Some((0, 0));
    }
    let dev = fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    Some(sum_net_dev(&dev))
}

fn sum_net_dev(dev: &str) -> (u64, u64) {
    dev.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| name.trim() != "lo")
        .filter_map(|(_, counters)| {
            let fields: Vec<u64> = counters
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            Some((*fields.first()?, *fields.get(8)?))
        })
        .fold((0, 0), |(rx, tx), (r, t)| (rx + r, tx + t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_sums_every_interface_but_loopback() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:  500 5 0 0 0 0 0 0  500 5 0 0 0 0 0 0\n  \
eth0: 1000 10 0 0 0 0 0 0  2000 20 0 0 0 0 0 0\n";
        assert_eq!(sum_net_dev(dev), (1000, 2000));
    }

    #[test]
    fn this_process_is_read() {
        let me = std::process::id();
        let (rss, peak) = resident_bytes(me).expect("our own status");
        assert!(rss > 0 && peak >= rss, "{rss} {peak}");
        assert!(cpu_ms(me).is_some());
        assert_eq!(
            net_bytes(me),
            Some((0, 0)),
            "our own namespace counts nothing"
        );
        assert_eq!(cpu_ms(u32::MAX), None, "a process that is gone is None");
    }
}
