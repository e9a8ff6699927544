//! Host files fed by guest output, bounded while they are written: a bwrap sandbox's log
//! (its agent's, bwrap's, pasta's and the resolver proxy's stderr), a microVM's runner log and
//! console, a worker VM's program output. A guest is hostile: one that makes any of them write
//! without end must not fill the host's disk, nor the adapter's memory when a tail is read.
//!
//! Each log is `<name>` and its older half `<name>.1`: at [`LIMIT`] bytes the file becomes
//! `<name>.1` (replacing the older one) and a new one starts, so the newest output is kept
//! and a log never holds more than [`CEILING`] bytes. [`BoundedFile`] is that file;
//! [`pump`] feeds one from a pipe (the usual way: a process's stdout or stderr) in a task of
//! the caller's runtime; [`tail`] reads the newest bytes of both halves, seeking, never
//! reading the whole.
//!
//! Not here: what a guest may make a log say (the agent limits its own lines' rate), and
//! which logs exist (each backend's layout).

mod file;
mod pump;
mod tail;

use std::path::{Path, PathBuf};

pub use file::{BoundedFile, Start};
pub use pump::{pump, start, Drained};
pub use tail::tail;

/// Bytes one file of a log holds before it is rotated. The newest output is what explains a
/// failure; a kernel's boot messages fit many times over.
pub const LIMIT: u64 = 2 << 20;

/// The most a log takes on the host: its two files at [`LIMIT`].
pub const CEILING: u64 = 2 * LIMIT;

/// The older half of a rotated log: `console.log` -> `console.log.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}
