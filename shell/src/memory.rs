//! Giving memory back after large requests. The adapter uses glibc's malloc (the shell and
//! its plugin share it): by default a buffer past the mmap threshold gets its own mapping, but
//! the threshold rises to the largest such buffer freed (up to 32 MiB), after which a large
//! request's buffers land in the arenas (one per thread that allocated, up to eight per core),
//! and what is freed there stays in the process. Measured on a 4 x 40 MiB `fs::write`: RSS
//! stayed ~107 MiB above idle for good without this module (README, "Adapter memory").
//!
//! Two things bring it back: a fixed mmap threshold, so a large buffer is always its own
//! mapping and leaves with `free`; and `malloc_trim` after a large request, which returns the
//! free pages the arenas still hold (the pieces a growing buffer left behind).
//!
//! The one module of the shell with `unsafe`: two libc calls into malloc's own bookkeeping.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

/// A request whose JSON is at least this long is followed by a trim.
pub const LARGE_REQUEST_BYTES: usize = 1024 * 1024;

/// Buffers from this size up are their own mapping (glibc's default start is 128 KiB, and it
/// moves; pinning it keeps large buffers out of the arenas).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 256 * 1024;

/// One trim at a time: calls that end together need one pass, not one each.
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// How much of each request and reply iii-sdk copies into its trace when nobody said
/// (`III_TRACE_PAYLOAD_MAX_BYTES`; its own default is everything): a whole 50 MiB payload,
/// serialised once more and held until the trace is exported, was the largest copy of all.
const TRACE_PAYLOAD_MAX_BYTES: &str = "65536";

/// Bounds what the SDK's traces copy of a payload, unless the operator chose (any value,
/// including `unlimited`, or `III_DISABLE_TRACE_PAYLOADS=1`, which Compose sets). Call before
/// any thread starts: it sets an environment variable.
pub fn cap_trace_payloads() {
    if std::env::var_os("III_TRACE_PAYLOAD_MAX_BYTES").is_none() {
        std::env::set_var("III_TRACE_PAYLOAD_MAX_BYTES", TRACE_PAYLOAD_MAX_BYTES);
    }
}

/// Sets malloc's parameters; call first thing in `main`.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes a parameter of glibc's allocator (under its own lock);
        // no memory is touched and it is valid to call at any time.
        let accepted = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        if accepted != 1 {
            tracing::debug!("malloc refused the mmap threshold; large buffers may stay cached");
        }
    }
}

/// Returns the free memory malloc holds to the kernel, on a blocking thread (a trim walks
/// every arena). Skipped while another trim runs.
pub fn release_after_large_request() {
    if TRIMMING.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::task::spawn_blocking(|| {
        trim();
        TRIMMING.store(false, Ordering::Release);
    });
}

fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes each arena's lock and releases only pages of free chunks
        // (madvise/sbrk); memory in use is untouched, and it is safe from any thread.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
