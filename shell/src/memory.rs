//! Keeping the adapter's memory near its working set. The shell and its plugin share glibc's
//! malloc. By default a buffer past the mmap threshold gets its own mapping (returned by
//! `free`), but the threshold rises to the largest such buffer freed (up to 32 MiB), after
//! which mid-sized request buffers (a 256 KiB `fs::write` is a 341 KiB JSON text) land in the
//! arenas, one per thread that allocated, and what is freed there mostly stays in the process.
//! A fixed threshold keeps them out: measured on the 60 s soak, the adapter ended at 91-93 MiB
//! instead of 104 (start 38). Buffers of 32 MiB and more are mappings either way (the large
//! payload test measures the same with and without it), so no `malloc_trim` is needed.
//!
//! Also here: the cap on what iii-sdk's traces copy of each payload.
//!
//! The one module of the shell with `unsafe`: one libc call into malloc's parameters.

#![allow(unsafe_code)]

/// Buffers from this size up are their own mapping (glibc starts at 128 KiB and moves it;
/// pinning it keeps request-sized buffers out of the arenas, and 64 KiB agent frames in).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 256 * 1024;

/// How much of each request and reply iii-sdk copies into its trace when nobody said
/// (`III_TRACE_PAYLOAD_MAX_BYTES`; its own default is everything): a whole 53 MiB request,
/// serialised once more and held until the trace is exported, was the largest copy of all.
const TRACE_PAYLOAD_MAX_BYTES: &str = "65536";

/// Sets malloc's parameters; call first thing in `main`.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes a parameter of glibc's allocator (under its own lock);
        // no memory is touched and it is valid to call at any time.
        let accepted = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        if accepted != 1 {
            eprintln!(
                "sandbox-libkrun: malloc refused the mmap threshold; freed buffers may stay cached"
            );
        }
    }
}

/// Bounds what the SDK's traces copy of a payload, unless the operator chose (any value,
/// `unlimited` included; `III_DISABLE_TRACE_PAYLOADS=1`, which Compose sets, turns the copies
/// off). Call before any thread starts: it sets an environment variable.
pub fn cap_trace_payloads() {
    if std::env::var_os("III_TRACE_PAYLOAD_MAX_BYTES").is_none() {
        std::env::set_var("III_TRACE_PAYLOAD_MAX_BYTES", TRACE_PAYLOAD_MAX_BYTES);
    }
}
