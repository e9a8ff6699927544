//! A host process as the kernel's `/proc/<pid>` files keep it: its `stat` line with named
//! fields ([`ProcStat`]), and for `metrics` its CPU time, its resident memory, and the byte
//! counters of the network namespace it is in. Read from the host side only, of processes the
//! adapter started; nothing a guest names is opened.

use std::fs;
use std::path::Path;

/// Clock ticks a second of `/proc/<pid>/stat`'s times (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: u64 = 100;

/// The fields of a `/proc/<pid>/stat` (or `/proc/<pid>/task/<tid>/stat`) line the adapter
/// reads, by their proc(5) names. The line is parsed in one place: the command name (field 2)
/// may hold spaces and parentheses, so the fields are counted after its last `)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `T`, `Z`, `X`, ...
    pub state: char,
    /// Fields 14 and 15: user and system time of the process (all its threads), in ticks.
    pub utime: u64,
    pub stime: u64,
    /// Fields 16 and 17: the same of its reaped children.
    pub cutime: u64,
    pub cstime: u64,
    /// Field 22: when it started, in ticks since boot (a pid and this name one process).
    pub start_time: u64,
    /// Field 52: its wait status once it has exited (a zombie's), `None` before Linux 3.5.
    pub exit_code: Option<i32>,
}

impl ProcStat {
    /// The stat of process `pid`; `None` once it is gone (or reaped).
    pub fn of(pid: u32) -> Option<ProcStat> {
        Self::read(Path::new(&format!("/proc/{pid}/stat")))
    }

    /// The stat line in the file at `path` (a thread's, under `/proc/<pid>/task`).
    pub fn read(path: &Path) -> Option<ProcStat> {
        Self::parse(&fs::read_to_string(path).ok()?)
    }

    pub fn parse(line: &str) -> Option<ProcStat> {
        let fields: Vec<&str> = line.rsplit_once(')')?.1.split_whitespace().collect();
        // Field N of proc(5) is fields[N - 3]: the first after the name is the state (3).
        let field = |n: usize| fields.get(n - 3).copied();
        let number = |n: usize| field(n)?.parse::<u64>().ok();
        Some(ProcStat {
            state: field(3)?.chars().next()?,
            utime: number(14)?,
            stime: number(15)?,
            cutime: number(16)?,
            cstime: number(17)?,
            start_time: number(22)?,
            exit_code: field(52).and_then(|code| code.parse().ok()),
        })
    }

    /// Exited: only its zombie is left, or it is being torn down (`X`, `x`).
    pub fn has_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// User and system time of `pid`, all its threads, and of its reaped children, in
/// milliseconds; `None` once it is gone.
pub fn cpu_ms(pid: u32) -> Option<u64> {
    let stat = ProcStat::of(pid)?;
    let ticks = stat.utime + stat.stime + stat.cutime + stat.cstime;
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

    /// A name with spaces and parentheses does not move the fields; a zombie's exit status
    /// is read from field 52; a line cut short is no stat.
    #[test]
    fn a_stat_line_is_read_by_field_names() {
        let fields_after_name: Vec<String> = (3..=52)
            .map(|n| match n {
                3 => "Z".to_string(),
                14 => "120".into(),
                15 => "30".into(),
                16 => "5".into(),
                17 => "1".into(),
                22 => "98765".into(),
                52 => "35072".into(),
                n => n.to_string(),
            })
            .collect();
        let line = format!("4242 (a (b) c) {}\n", fields_after_name.join(" "));
        let stat = ProcStat::parse(&line).expect("a stat");
        assert_eq!(
            stat,
            ProcStat {
                state: 'Z',
                utime: 120,
                stime: 30,
                cutime: 5,
                cstime: 1,
                start_time: 98765,
                exit_code: Some(35072),
            }
        );
        assert!(stat.has_exited());
        // Before Linux 3.5 the line ends at field 44: no exit status, the rest as it is.
        let short = format!("1 (x) {}", fields_after_name[..42].join(" "));
        assert_eq!(ProcStat::parse(&short).unwrap().exit_code, None);
        assert_eq!(ProcStat::parse("1 (x) R 1 2"), None);
        assert_eq!(ProcStat::parse("no name here"), None);
        // This process: running, started since boot, its own CPU time counted.
        let me = ProcStat::of(std::process::id()).expect("this process");
        assert!(!me.has_exited() && me.start_time > 0, "{me:?}");
        assert!(cpu_ms(std::process::id()).is_some());
    }

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
