//! What the kernel counts per user or host-wide, budgeted so that `max_concurrent_sandboxes`
//! sandboxes together cannot exhaust it for each other, the adapter's user or the host.
//!
//! inotify instances and watches, and fanotify groups and marks, are counted per user
//! namespace and uid, and every count is charged up the chain of user namespaces to the
//! host's: all of an adapter's sandboxes end in ONE host counter, the one of the uid that owns
//! their user namespaces (a root adapter's subordinate base id; an ordinary user's own uid,
//! shared with that user's own programs), under the host's `user.max_inotify_instances`
//! (128 by default). Each namespace has its own limits (`/proc/sys/user/max_*`), checked at
//! every level of the chain: the launcher writes a sandbox's share into the sandbox's user
//! namespace while it is root there, before the sandbox's processes start in a namespace
//! nested in it, whose root can raise only its own level's limits, never this one.
//!
//! The shares are sized so that every sandbox at its maximum at once still leaves a reserve:
//! - a root adapter raises the host's limit at start to what it was before (the reserve, left
//!   to everything else of that uid) plus `max_concurrent_sandboxes` times a sandbox's share,
//!   1/[`HOST_SHARES`] of the limit before;
//! - an adapter that cannot raise it (an ordinary user) keeps 1/[`USER_RESERVE_SHARES`] of the
//!   user's limit for the user's own programs and divides the rest by
//!   `max_concurrent_sandboxes`; a share of none refuses every create (S300).
//!
//! Open files: `RLIMIT_NOFILE` bounds one process, and a sandbox holds at most
//! `max_pids_per_sandbox` processes (its cgroup's `pids.max`), so a sandbox's open files in
//! all are at most their product; the host refuses a new one to every process without
//! CAP_SYS_ADMIN once `fs.file-max` files are open host-wide. The product is budgeted like the
//! counters: a root adapter whose sandboxes' memory is bounded raises `fs.file-max` by
//! `max_concurrent_sandboxes` times the product (each open file's `struct file` is kernel
//! memory charged to the sandbox's memory cgroup, on cgroup v1 as on v2, so the files cannot
//! outgrow the sandboxes' memory limits); otherwise 1/[`HOST_FILE_RESERVE_SHARES`] of
//! `fs.file-max` is kept for the host and the rest divided, and a sandbox's hard limit is
//! lowered to fit (down to [`MIN_OPEN_FILES`]; past that its pids are cut instead, and a cut
//! below [`MIN_PIDS`] refuses every create).
//!
//! `RLIMIT_NOFILE` is set by the launcher before it becomes bwrap, so bwrap, the agent and
//! every process of the sandbox inherit it; raising a hard limit needs CAP_SYS_RESOURCE in the
//! host's user namespace, which no process of a sandbox has.
//!
//! What the host's limits were before a root adapter first raised them is kept in
//! [`ORIGINALS`] (under `/run`, emptied at boot as the kernel's limits are reset), so an
//! adapter started again, or a second one, raises from the same base instead of compounding.

use std::io::{self, Read, Seek, Write};

use serde::{Deserialize, Serialize};

/// A root adapter's sandboxes each get this fraction of the host's per-user inotify and
/// fanotify limits as they were before the adapter raised them.
pub const HOST_SHARES: u64 = 8;
/// An adapter that cannot raise the host's per-user limits keeps this fraction of them for
/// its user's own programs.
pub const USER_RESERVE_SHARES: u64 = 4;
/// An adapter that cannot raise `fs.file-max` keeps this fraction of it for the host.
pub const HOST_FILE_RESERVE_SHARES: u64 = sandbox_core::file_share::HOST_FILE_RESERVE_SHARES;
/// A sandbox's `RLIMIT_NOFILE` where its budget allows: soft as most hosts' default (programs
/// using `select` break on descriptors past 1024), hard what a program may raise itself to.
pub const SANDBOX_OPEN_FILES: (u64, u64) = (1024, 4096);
/// The lowest hard open-file limit the budget gives a sandbox's processes; a smaller budget
/// cuts the sandbox's pids instead.
pub const MIN_OPEN_FILES: u64 = 256;
/// The fewest processes a cut leaves a sandbox; a budget that would leave fewer refuses every
/// create (S300).
pub const MIN_PIDS: u64 = 16;
/// A worker VM's, soft and hard: what libkrun's worker VMs get by default
/// (`III_VM_NOFILE_LIMIT` unset), as long-lived services may hold many connections.
pub const WORKER_OPEN_FILES: u64 = sandbox_core::ops::worker::DEFAULT_NOFILE_LIMIT;

/// The per-namespace counters, by their file under `/proc/sys/user/`.
const COUNTERS: [&str; 4] = [
    "max_inotify_instances",
    "max_inotify_watches",
    "max_fanotify_groups",
    "max_fanotify_marks",
];
const COUNTERS_DIR: &str = "/proc/sys/user";
/// The same limits of the host's (initial) user namespace under their older names, which a
/// root adapter writes: the kernel refuses writes to `/proc/sys/user/` of the initial
/// namespace on some hosts where these are taken.
const HOST_COUNTER_FILES: [&str; 4] = [
    "/proc/sys/fs/inotify/max_user_instances",
    "/proc/sys/fs/inotify/max_user_watches",
    "/proc/sys/fs/fanotify/max_user_groups",
    "/proc/sys/fs/fanotify/max_user_marks",
];
const FILE_MAX: &str = sandbox_core::file_share::FILE_MAX;
const FILE_MAX_NAME: &str = "file-max";
/// The host's limits before a root adapter first raised them since boot (`name value` lines).
pub const ORIGINALS: &str = "/run/sandbox-libkrun-host-limits";

/// What the launcher applies to one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ceilings {
    /// `RLIMIT_NOFILE` of every process of the sandbox (never above the launcher's own).
    pub open_files_soft: u64,
    pub open_files_hard: u64,
    /// The sandbox's user namespace's limits, in [`COUNTERS`] order; none where this kernel
    /// has no such counter.
    pub counters: [Option<u64>; 4],
}

impl Ceilings {
    /// Writes the namespace limits into the caller's user namespace (it must be root there
    /// and the sandbox's processes must run in namespaces nested in it) and lowers
    /// `RLIMIT_NOFILE`, which every process started from here inherits.
    pub fn apply(&self) -> Result<(), String> {
        for (name, limit) in COUNTERS.iter().zip(self.counters) {
            let Some(limit) = limit else { continue };
            let file = format!("{COUNTERS_DIR}/{name}");
            std::fs::write(&file, limit.to_string())
                .map_err(|e| format!("cannot set the sandbox's {name} ({file}): {e}"))?;
        }
        self.limit_open_files()
            .map_err(|e| format!("cannot set the sandbox's RLIMIT_NOFILE: {e}"))
    }

    fn limit_open_files(&self) -> io::Result<()> {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        // In the sandbox's user namespace now: a hard limit can be lowered only.
        let (_, current_hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        let hard = self.open_files_hard.min(current_hard);
        setrlimit(
            Resource::RLIMIT_NOFILE,
            self.open_files_soft.min(hard),
            hard,
        )?;
        Ok(())
    }
}

/// One host limit and how it is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Share {
    /// The host's limit now.
    limit: u64,
    /// What no sandbox may take: the limit before this adapter raised it, or the part kept
    /// for the adapter's user (counters) or the host (files).
    reserve: u64,
    /// One sandbox's: what is above the reserve divided by `max_concurrent_sandboxes`.
    each: u64,
    /// Whether the limit was raised by a root adapter (this one or an earlier one).
    raised: bool,
}

impl Share {
    /// `limit`, raised from `original` to hold `cap` shares above it.
    fn raised(original: u64, limit: u64, cap: u64) -> Share {
        Share {
            limit,
            reserve: original,
            each: limit.saturating_sub(original) / cap.max(1),
            raised: true,
        }
    }

    /// `limit` as it is, 1/`shares` of it kept.
    fn kept(limit: u64, shares: u64, cap: u64) -> Share {
        let (reserve, each) = sandbox_core::file_share::kept_and_each(limit, shares, cap);
        Share {
            limit,
            reserve,
            each,
            raised: false,
        }
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "host_limit": self.limit,
            "kept_from_sandboxes": self.reserve,
            "per_sandbox": self.each,
            "raised_by_adapter": self.raised,
        })
    }
}

/// What the host gives this adapter's sandboxes, decided once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    cap: u64,
    counters: [Option<Share>; 4],
    files: Share,
    /// A sandbox's `RLIMIT_NOFILE` (soft, hard) and pids within its share of `files`.
    open_files: (u64, u64),
    pids: u64,
    /// Whether the sandboxes' memory and pids are bounded by their cgroups here (the open-file
    /// total holds only with their pids bounded).
    memory_bounded: bool,
    pids_bounded: bool,
    /// Why no sandbox can start within the budget: every create is refused with it (S300).
    refusal: Option<String>,
}

impl Budget {
    /// Reads the host's limits and, as root, raises them (see the module); logs what it did.
    pub fn at_start(cap: usize, pids: u32, memory_bounded: bool, pids_bounded: bool) -> Budget {
        let cap = (cap as u64).max(1);
        let pids = u64::from(pids).max(1);
        let mut originals = nix::unistd::geteuid()
            .is_root()
            .then(|| Originals::lock(std::path::Path::new(ORIGINALS)))
            .and_then(|locked| match locked {
                Ok(originals) => Some(originals),
                Err(e) => {
                    tracing::warn!(file = ORIGINALS, error = %e, "cannot keep the host's limits before raising them: they are shared, not raised");
                    None
                }
            });
        let mut counters = [None; 4];
        for (index, (name, host_file)) in COUNTERS.iter().zip(HOST_COUNTER_FILES).enumerate() {
            let Some(limit) = read_limit(&format!("{COUNTERS_DIR}/{name}")) else {
                continue;
            };
            let raised = originals.as_mut().and_then(|originals| {
                let original = originals.original(name, limit);
                let want = (original / HOST_SHARES).max(1);
                raise(host_file, name, original, limit, want, cap)
                    .map(|now| Share::raised(original, now, cap))
            });
            counters[index] =
                Some(raised.unwrap_or_else(|| Share::kept(limit, USER_RESERVE_SHARES, cap)));
        }
        let file_max = read_limit(FILE_MAX).unwrap_or(0);
        let files = originals
            .as_mut()
            // Raised only where every file's kernel memory is charged to a bounded memory
            // cgroup and the product below is bounded by pids.
            .filter(|_| memory_bounded && pids_bounded)
            .and_then(|originals| {
                let original = originals.original(FILE_MAX_NAME, file_max);
                let want = pids.saturating_mul(SANDBOX_OPEN_FILES.1);
                raise(FILE_MAX, FILE_MAX_NAME, original, file_max, want, cap)
                    .map(|now| Share::raised(original, now, cap))
            })
            .unwrap_or_else(|| Share::kept(file_max, HOST_FILE_RESERVE_SHARES, cap));
        if let Some(originals) = originals {
            if let Err(e) = originals.save() {
                tracing::warn!(file = ORIGINALS, error = %e, "cannot record the host's limits before raising them: an adapter started later raises from what it finds");
            }
        }
        let budget = Budget::plan(cap, pids, counters, files, memory_bounded, pids_bounded);
        match &budget.refusal {
            Some(why) => tracing::warn!(why, "creates are refused (S300)"),
            None => tracing::info!(
                open_files = ?budget.open_files,
                pids = budget.pids,
                file_max = budget.files.limit,
                per_sandbox_files = budget.files.each,
                inotify_instances = ?budget.counters[0].map(|s| s.each),
                "each sandbox's share of the host's open files and per-user counters"
            ),
        }
        budget
    }

    /// The sandboxes' limits within the shares.
    fn plan(
        cap: u64,
        pids: u64,
        counters: [Option<Share>; 4],
        files: Share,
        memory_bounded: bool,
        pids_bounded: bool,
    ) -> Budget {
        // Every limit that leaves a sandbox nothing, so that one fix is not followed by another.
        let mut refusals = Vec::new();
        for (name, share) in COUNTERS.iter().zip(counters) {
            let Some(share) = share else { continue };
            if share.each == 0 {
                refusals.push(format!(
                    "the host's per-user {name} ({}) leaves none for each of \
                     max_concurrent_sandboxes ({cap}) sandboxes once {} are kept for the \
                     adapter's user's own programs: lower max_concurrent_sandboxes, or raise \
                     user.{name} on the host (an adapter run as root raises it itself)",
                    share.limit, share.reserve
                ));
            }
        }
        let (soft, hard, cut) = open_files_within(files.each, pids);
        if cut < pids.min(MIN_PIDS) {
            refusals.push(format!(
                "fs.file-max ({}) leaves {} open files for each of max_concurrent_sandboxes \
                 ({cap}) sandboxes once {} are kept for the host: {cut} processes of \
                 {MIN_OPEN_FILES} files each, under the {MIN_PIDS} a sandbox needs; lower \
                 max_concurrent_sandboxes or raise fs.file-max on the host",
                files.limit, files.each, files.reserve
            ));
        }
        Budget {
            cap,
            counters,
            files,
            open_files: (soft, hard),
            pids: cut,
            memory_bounded,
            pids_bounded,
            refusal: (!refusals.is_empty()).then(|| refusals.join("; ")),
        }
    }

    /// A sandbox's ceilings (a worker VM's when `worker`: its open-file limit is its own, see
    /// [`WORKER_OPEN_FILES`]).
    pub fn ceilings(&self, worker: bool) -> Ceilings {
        let (open_files_soft, open_files_hard) = if worker {
            (WORKER_OPEN_FILES, WORKER_OPEN_FILES)
        } else {
            self.open_files
        };
        Ceilings {
            open_files_soft,
            open_files_hard,
            counters: self.counters.map(|share| share.map(|s| s.each)),
        }
    }

    /// The pids limit of a sandbox whose configuration says `configured`: cut to fit its
    /// open files (worker VMs keep theirs).
    pub fn pids(&self, configured: u32, worker: bool) -> u32 {
        if worker {
            return configured;
        }
        configured.min(u32::try_from(self.pids).unwrap_or(u32::MAX))
    }

    /// Why a sandbox cannot start within the budget (its create is S300).
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// For `adapter::info` (`isolation.ceilings`).
    pub fn describe(&self) -> serde_json::Value {
        let (soft, hard) = self.open_files;
        let per_sandbox = hard.saturating_mul(self.pids);
        let total = if self.pids_bounded {
            format!(
                "at most {per_sandbox} per sandbox (pids.max {} x hard limit {hard}), {} for \
                 max_concurrent_sandboxes ({}) sandboxes together, within fs.file-max {} less \
                 {} kept for the host{}",
                self.pids,
                per_sandbox.saturating_mul(self.cap),
                self.cap,
                self.files.limit,
                self.files.reserve,
                if self.files.raised {
                    " (fs.file-max raised by the adapter, which runs as root, from that reserve)"
                } else {
                    ""
                }
            )
        } else {
            "not bounded in all: the sandboxes' pids are not bounded here (allow_unbounded_sandboxes)".into()
        };
        let memory = if self.memory_bounded {
            "each open file's kernel memory (its struct file) is charged to the sandbox's memory cgroup, on cgroup v1 and v2, so no sandbox holds more files than its memory_mb pays for"
        } else {
            "the sandboxes' memory is not bounded here, so their files' kernel memory is not either"
        };
        let mut out = serde_json::json!({
            "open_files": {
                "soft": soft,
                "hard": hard,
                "pids": self.pids,
                "per_sandbox": per_sandbox,
                "sandboxes_together": per_sandbox.saturating_mul(self.cap),
                "file_max": self.files.describe(),
                "worker_vms": WORKER_OPEN_FILES,
                "total": total,
                "memory": memory,
                "how": "RLIMIT_NOFILE of every process of a sandbox (set by its launcher, never above the adapter's own hard limit; no guest can raise the hard one), sized with the sandbox's pids.max to fit its share of fs.file-max; worker VMs are not counted against max_concurrent_sandboxes and keep their own limit",
            },
            "how": format!(
                "inotify and fanotify: each sandbox's user namespace holds a share of the host's per-user limits (the host counts every sandbox of this adapter under one uid), so that max_concurrent_sandboxes ({}) sandboxes at their maximum leave the reserve: as root the adapter raises the host's limits by that many shares of 1/{HOST_SHARES} of what they were, otherwise 1/{USER_RESERVE_SHARES} stays with the adapter's user and the rest is divided",
                self.cap
            ),
            "refused": self.refusal,
        });
        for (name, share) in COUNTERS.iter().zip(self.counters) {
            if let Some(share) = share {
                let key = name.trim_start_matches("max_");
                out[key] = share.each.into();
                out["host"][key] = share.describe();
            }
        }
        out
    }
}

/// A sandbox's (soft, hard) `RLIMIT_NOFILE` and pids whose product fits `total`: the wanted
/// limits, else a lower hard limit, else (below [`MIN_OPEN_FILES`]) fewer pids.
fn open_files_within(total: u64, pids: u64) -> (u64, u64, u64) {
    let (want_soft, want_hard) = SANDBOX_OPEN_FILES;
    let pids = pids.max(1);
    let hard = (total / pids).min(want_hard);
    if hard >= MIN_OPEN_FILES {
        return (want_soft.min(hard), hard, pids);
    }
    let hard = MIN_OPEN_FILES.min(want_hard);
    (want_soft.min(hard), hard, (total / hard).min(pids))
}

fn read_limit(file: &str) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Raises the host limit in `file` (now `limit`) to `original` plus `cap` times `want`, where
/// it is lower; the limit then, or none where it cannot be written.
fn raise(file: &str, name: &str, original: u64, limit: u64, want: u64, cap: u64) -> Option<u64> {
    let target = original.saturating_add(want.saturating_mul(cap));
    if limit >= target {
        return Some(limit);
    }
    match std::fs::write(file, target.to_string()) {
        Ok(()) => {
            tracing::info!(
                name,
                from = limit,
                to = target,
                before_any_adapter = original,
                "raised a host limit so that max_concurrent_sandboxes sandboxes at their share leave what it was to the host"
            );
            Some(target)
        }
        Err(e) => {
            tracing::warn!(name, error = %e, "cannot raise a host limit: sandboxes share it instead");
            None
        }
    }
}

/// The host's limits before any adapter raised them, kept in [`ORIGINALS`] under an exclusive
/// lock while this adapter raises them.
struct Originals {
    file: nix::fcntl::Flock<std::fs::File>,
    values: Vec<(String, u64)>,
}

impl Originals {
    fn lock(path: &std::path::Path) -> io::Result<Originals> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| io::Error::from(e))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let values = parse_originals(&text);
        Ok(Originals { file, values })
    }

    /// The recorded value of `name`, else `now` (recorded).
    fn original(&mut self, name: &str, now: u64) -> u64 {
        if let Some((_, value)) = self.values.iter().find(|(n, _)| n == name) {
            return *value;
        }
        self.values.push((name.to_string(), now));
        now
    }

    fn save(mut self) -> io::Result<()> {
        let text: String = self
            .values
            .iter()
            .map(|(name, value)| format!("{name} {value}\n"))
            .collect();
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(text.as_bytes())
    }
}

fn parse_originals(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(cap: u64, pids: u64, counters: [Option<Share>; 4], files: Share) -> Budget {
        Budget::plan(cap, pids, counters, files, true, true)
    }

    #[test]
    fn a_root_adapter_raises_by_cap_shares_and_keeps_the_original_for_the_host() {
        // 128 instances before: 16 a sandbox, 32 sandboxes: 128 + 512.
        let share = Share::raised(128, 128 + 32 * 16, 32);
        assert_eq!((share.each, share.reserve), (16, 128));
        let files = Share::raised(2_466_239, 2_466_239 + 32 * 1024 * 4096, 32);
        let b = budget(32, 1024, [Some(share); 4], files);
        assert_eq!(b.refusal(), None);
        assert_eq!((b.open_files, b.pids), ((1024, 4096), 1024));
        assert_eq!(b.pids(1024, false), 1024);
    }

    #[test]
    fn an_ordinary_users_shares_leave_a_quarter_and_fit_cap_times() {
        for (limit, cap) in [(128u64, 32u64), (128, 10), (192_540, 32), (100, 75)] {
            let share = Share::kept(limit, USER_RESERVE_SHARES, cap);
            assert!(share.each >= 1, "{limit} {cap}");
            assert!(
                share.each * cap + share.reserve <= limit,
                "{cap} sandboxes at their share and the reserve fit {limit}: {share:?}"
            );
            assert!(share.reserve * USER_RESERVE_SHARES >= limit);
        }
        assert_eq!(Share::kept(128, USER_RESERVE_SHARES, 32).each, 3);
    }

    #[test]
    fn too_many_sandboxes_for_a_counter_refuse_every_create() {
        let none = Share::kept(128, USER_RESERVE_SHARES, 200);
        assert_eq!(none.each, 0);
        let files = Share::kept(2_466_239, HOST_FILE_RESERVE_SHARES, 200);
        let b = budget(200, 64, [Some(none), None, Some(none), None], files);
        let why = b.refusal().expect("refused");
        assert!(why.contains("max_inotify_instances (128)"), "{why}");
        assert!(why.contains("max_fanotify_groups (128)"), "{why}");
    }

    #[test]
    fn open_files_lower_the_hard_limit_then_the_pids_and_always_fit() {
        // An ordinary user's default: file-max 2.47 M, half kept, 32 sandboxes of 1024 pids.
        let files = Share::kept(2_466_239, HOST_FILE_RESERVE_SHARES, 32);
        let b = budget(32, 1024, [None; 4], files);
        assert_eq!(b.open_files, (256, 256));
        assert_eq!(b.pids, files.each / 256);
        assert_eq!(b.pids(1024, false), b.pids as u32);
        assert_eq!(b.pids(1024, true), 1024);
        // Ten sandboxes of 32 pids: the hard limit alone is lowered.
        let files = Share::kept(2_466_239, HOST_FILE_RESERVE_SHARES, 10);
        let b = budget(10, 32, [None; 4], files);
        assert_eq!(b.pids, 32);
        assert_eq!(b.open_files, (1024, files.each / 32));
        for (total, pids) in [(38_534, 1024), (123_311, 32), (10_000_000, 1024), (5, 3)] {
            let (soft, hard, cut) = open_files_within(total, pids);
            assert!(soft <= hard && cut <= pids, "{total} {pids}");
            assert!(hard * cut <= total.max(MIN_OPEN_FILES), "{total} {pids}");
        }
        // Too little for 16 processes: refused.
        let files = Share::kept(100_000, HOST_FILE_RESERVE_SHARES, 32);
        let b = budget(32, 1024, [None; 4], files);
        assert!(b
            .refusal()
            .expect("refused")
            .contains("fs.file-max (100000)"));
    }

    #[test]
    fn sandboxes_and_workers_differ_in_open_files_only() {
        let files = Share::raised(1000, 1000 + 4 * 1024 * 4096, 4);
        let b = budget(4, 1024, [Some(Share::kept(128, 4, 4)); 4], files);
        let (sandbox, worker) = (b.ceilings(false), b.ceilings(true));
        assert_eq!(
            (sandbox.open_files_soft, sandbox.open_files_hard),
            (1024, 4096)
        );
        assert_eq!(worker.open_files_hard, WORKER_OPEN_FILES);
        assert_eq!(sandbox.counters, worker.counters);
        assert_eq!(sandbox.counters[0], Some(24));
        let info = b.describe();
        assert_eq!(info["open_files"]["hard"], 4096);
        assert_eq!(info["inotify_instances"], 24);
        assert_eq!(info["host"]["inotify_instances"]["kept_from_sandboxes"], 32);
        assert!(info["refused"].is_null(), "{info}");
    }

    #[test]
    fn the_first_value_recorded_is_the_original_for_every_later_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits");
        let mut first = Originals::lock(&path).unwrap();
        assert_eq!(first.original("file-max", 2_466_239), 2_466_239);
        first.save().unwrap();
        // Raised since: a later start still divides what is above the first value.
        let mut later = Originals::lock(&path).unwrap();
        assert_eq!(later.original("file-max", 136_683_967), 2_466_239);
        assert_eq!(later.original("max_inotify_instances", 128), 128);
        later.save().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "file-max 2466239\nmax_inotify_instances 128\n");
    }

    #[test]
    fn recorded_originals_are_read_back() {
        let values = parse_originals("file-max 2466239\nmax_inotify_instances 128\nbad\n");
        assert_eq!(
            values,
            vec![
                ("file-max".to_string(), 2_466_239),
                ("max_inotify_instances".to_string(), 128)
            ]
        );
    }
}
