//! Pull progress: a trait the caller implements (the pull binary draws a bar) and a default
//! that logs through `tracing` (bytes and layers) so long pulls are visible in the adapter log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Receives pull events. All methods have empty defaults.
pub trait PullProgress: Send + Sync {
    /// The manifest is known: `layers` blobs, `total_bytes` compressed, `cached_bytes` of which
    /// are already in the cache.
    fn started(&self, _reference: &str, _layers: usize, _total_bytes: u64, _cached_bytes: u64) {}
    /// `bytes` more were downloaded.
    fn downloaded(&self, _bytes: u64) {}
    /// Layer `index` (0-based) is being unpacked.
    fn unpacking(&self, _index: usize, _layers: usize) {}
    /// The root is ready.
    fn finished(&self, _reference: &str) {}
}

/// Ignores every event.
pub struct NoProgress;
impl PullProgress for NoProgress {}

/// Logs progress at most every two seconds and at each phase change.
pub struct TracingProgress {
    total: AtomicU64,
    done: AtomicU64,
    last: Mutex<Instant>,
}

impl Default for TracingProgress {
    fn default() -> Self {
        TracingProgress {
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        }
    }
}

impl PullProgress for TracingProgress {
    fn started(&self, reference: &str, layers: usize, total: u64, cached: u64) {
        self.total.store(total, Ordering::Relaxed);
        self.done.store(cached, Ordering::Relaxed);
        tracing::info!(
            reference,
            layers,
            total_bytes = total,
            cached_bytes = cached,
            "pulling image"
        );
    }
    fn downloaded(&self, bytes: u64) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if last.elapsed() >= Duration::from_secs(2) {
            *last = Instant::now();
            let total = self.total.load(Ordering::Relaxed);
            tracing::info!(
                downloaded_bytes = done,
                total_bytes = total,
                "pull progress"
            );
        }
    }
    fn unpacking(&self, index: usize, layers: usize) {
        tracing::info!(layer = index + 1, layers, "unpacking layer");
    }
    fn finished(&self, reference: &str) {
        tracing::info!(reference, "image ready");
    }
}
