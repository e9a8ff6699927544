//! The posture test's machinery (posture.rs): every host process an adapter started, read
//! from `/proc` (`procfs.rs`), named by role (`tree.rs`), described in symbols that hold on
//! any host (`describe.rs`, `caps.rs`, `dumpable.rs`), its parent-death behaviour measured
//! by killing the adapter (`parent_death.rs`), and compared with the expected table kept as
//! data in `tests/e2e/posture/` (`table.rs`).

#![allow(dead_code)] // each test uses its own subset

pub mod caps;
pub mod describe;
pub mod dumpable;
pub mod parent_death;
pub mod procfs;
pub mod table;
pub mod tree;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use describe::{Context, Observation, Observed};
use procfs::RawProcess;
use table::{Table, Value};

/// Where the expected tables are.
pub fn table_path(file: &str) -> PathBuf {
    e2e_tests::repo_root().join("tests/e2e/posture").join(file)
}

/// The snapshot of every process's pid, name, program and credentials: equal twice in a
/// row once nothing is starting any more.
fn snapshot(adapter: u32, groups: &[(String, u32)]) -> Vec<String> {
    tree::roles(adapter, groups)
        .into_iter()
        .map(|f| {
            let status = std::fs::read_to_string(format!("/proc/{}/status", f.pid))
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    l.starts_with("Uid") || l.starts_with("Cap") || l.starts_with("Seccomp")
                })
                .collect::<Vec<_>>()
                .join(" ");
            let fds = std::fs::read_dir(format!("/proc/{}/fd", f.pid)).map_or(0, |d| d.count());
            let exe = procfs::link(&format!("/proc/{}/exe", f.pid));
            format!("{} {} {exe} {status} fds={fds}", f.role, f.pid)
        })
        .collect()
}

/// Waits (up to `limit`) until the adapter's process tree has held still for 2 s: the pool's
/// next launcher has started and settled, every sandbox's helpers are up, and their first
/// timers have run (pasta fills its pools of sockets and pipes about a second after start).
pub fn settle(adapter: u32, groups: &[(String, u32)], limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut last = snapshot(adapter, groups);
    let mut still = 0;
    while Instant::now() < deadline && still < 10 {
        std::thread::sleep(Duration::from_millis(200));
        let now = snapshot(adapter, groups);
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
}

/// Every process under `adapter` read and described, and what to watch when it dies.
pub fn observe(
    adapter: u32,
    groups: &[(String, u32)],
    context: &Context,
) -> (Table, Vec<parent_death::Watched>) {
    let adapter_raw = RawProcess::read(adapter).expect("the adapter's /proc entry");
    let mut procs = Vec::new();
    let mut watched = Vec::new();
    for found in tree::roles(adapter, groups) {
        let Some(raw) = RawProcess::read(found.pid) else {
            continue;
        };
        if let Some(start_time) = parent_death::start_time(found.pid) {
            watched.push(parent_death::Watched {
                role: found.role.clone(),
                pid: found.pid,
                start_time,
            });
        }
        procs.push(Observation {
            role: found.role,
            parent: found.parent,
            raw,
        });
    }
    let observed = Observed {
        adapter: adapter_raw,
        procs,
        starter: RawProcess::read(std::process::id()).expect("this test's /proc entry"),
    };
    (describe::describe(&observed, context), watched)
}

/// Marks every descriptor this test holds above 2 close-on-exec, so that the adapter
/// inherits none of what started the test (cargo's jobserver pipe, a terminal's), then opens
/// one pipe that it does inherit: the tables then show, on any runner, how far a descriptor
/// an adapter is started with reaches (`pipe the adapter inherited from its starter`).
/// Returns the pipe's ends, to hold while the adapter runs.
pub fn plant_inherited_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use nix::libc;
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        let fds: Vec<i32> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|fd| *fd > 2)
            .collect();
        for fd in fds {
            // SAFETY: F_GETFD/F_SETFD only change the close-on-exec flag of a descriptor
            // this process holds (or fail on one already closed).
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
    }
    let mut ends = [0; 2];
    // SAFETY: pipe writes two new descriptors (without close-on-exec) into `ends`.
    let rc = unsafe { libc::pipe(ends.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
    use std::os::fd::FromRawFd;
    // SAFETY: both descriptors were just made and are ours alone.
    unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(ends[0]),
            std::os::fd::OwnedFd::from_raw_fd(ends[1]),
        )
    }
}

/// Adds each process's parent-death outcome to `table`.
pub fn add_parent_death(table: &mut Table, outcome: &std::collections::BTreeMap<String, String>) {
    for process in &mut table.processes {
        let value = outcome
            .get(&process.role)
            .cloned()
            .unwrap_or_else(|| "(not measured)".into());
        process.set("parent_death", Value::Text(value));
    }
}

/// Compares `observed` with the table in `file`; panics naming every drift, after printing
/// the observed table in the file's layout. `POSTURE_PRINT=1` prints it even when nothing
/// drifted; `POSTURE_PRINT=update` writes it over the file (then review the diff, and the
/// comments that explain each value).
pub fn check(file: &str, observed: &Table) {
    let path = table_path(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the expected table {}: {e}", path.display()));
    let expected = Table::parse(&text)
        .unwrap_or_else(|e| panic!("the expected table {}: {e}", path.display()));
    let drifts = table::compare(&expected, observed);
    let mode = std::env::var("POSTURE_PRINT").unwrap_or_default();
    let laid = expected.observed_in_layout(observed).render();
    if mode == "update" {
        std::fs::write(&path, &laid).expect("write the table");
        println!("*** posture: wrote the observed table over {file} ***");
        return;
    }
    if !drifts.is_empty() || !mode.is_empty() {
        println!("===== observed posture ({file} layout) =====\n{laid}===== end =====");
    }
    // A table written from the code before any run could observe it (libkrun's, until the
    // VM lab records it) cannot judge: the comparison did not run, and says so.
    if text.contains("NOT YET RECORDED") {
        println!(
            "\n*** posture check against {file} DID NOT RUN: that table is not recorded yet \
             (the observed table is printed above; POSTURE_PRINT=update in the VM lab writes it) ***\n"
        );
        return;
    }
    let lines: Vec<String> = drifts.iter().map(ToString::to_string).collect();
    assert!(
        lines.is_empty(),
        "{} drift(s) from tests/e2e/posture/{file}:\n  {}\n(the observed table is printed above; \
         POSTURE_PRINT=update writes it over the file)",
        lines.len(),
        lines.join("\n  ")
    );
    println!(
        "*** posture: {} processes match tests/e2e/posture/{file} ***",
        observed.processes.len()
    );
}
