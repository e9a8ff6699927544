//! Adapter memory on large inline payloads: four `fs::write`s of
//! `PAYLOAD_MIB` MiB each as `content_b64` at once, then one `exec` with a `PAYLOAD_MIB` MiB
//! `stdin`, through the engine, on the bwrap plugin. The adapter's peak (`VmHWM`, reset before
//! each phase where the kernel lets us, else VmRSS sampled every 5 ms) must stay under a small
//! multiple of the payload in flight, and its `VmRSS` must come back near its idle level within
//! a few seconds. Prints the figures.
//!
//! The largest inline request is the bus's: the engine and iii-sdk refuse a WebSocket message
//! over 64 MiB, so `content_b64` carries at most ~47 MiB of content (larger content goes
//! through a channel ref); `PAYLOAD_MIB` stays below that.

mod sandbox_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e_tests::{bwrap_usable, AdapterOptions, Stack};
use sandbox_support::{create, exec_ok, fs_ok, status_kib, stdout};
use serde_json::json;

/// Content of each request, in MiB.
const PAYLOAD_MIB: u64 = 40;
/// Parallel `fs::write`s.
const WRITERS: u64 = 4;
/// Peak above idle allowed per MiB of content in flight. The floor is twice the base64 text
/// (2.67): the JSON text is made from the parsed `Value` and parsed again across the plugin
/// boundary, each copy made while its source is alive. Measured 1.34 for the four writes and
/// 2.67 for the exec (3.92 and 6.33 before the copies went).
const PEAK_PER_PAYLOAD: f64 = 3.5;
/// How far above idle the adapter may stay once the requests are done (allocator caches),
/// besides the read buffer of the SDK's engine connection: tungstenite keeps the allocation
/// of the largest message received for the connection's life (one request's JSON, at most the
/// bus's 64 MiB), out of the adapter's reach.
const SETTLED_SLACK_MIB: u64 = 24;
/// How long RSS may take to come back.
const SETTLE_WITHIN: Duration = Duration::from_secs(10);

/// Bytes that do not compress or repeat (xorshift), so nothing along the way can shortcut them.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Starts a new peak: `5` in `clear_refs` resets `VmHWM` to the current RSS. False where the
/// kernel refuses (another user's process without the right to write there).
fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The largest VmRSS seen every 5 ms until `stop` is set: the peak where `VmHWM` cannot be
/// reset (it would still hold an earlier phase's peak).
fn sample_peak(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            peak = peak.max(status_kib(pid, "VmRSS").unwrap_or(0));
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    })
}

/// The phase's peak: `VmHWM` when it was reset at the start, else the sampled one.
fn phase_peak(pid: u32, resettable: bool, sampled: u64) -> u64 {
    let hwm = status_kib(pid, "VmHWM").expect("adapter VmHWM");
    if resettable {
        hwm.max(sampled)
    } else {
        sampled
    }
}

/// Waits up to `SETTLE_WITHIN` for VmRSS to drop to `limit_kib`; answers the last reading.
async fn settle(pid: u32, limit_kib: u64) -> u64 {
    let deadline = Instant::now() + SETTLE_WITHIN;
    loop {
        let rss = status_kib(pid, "VmRSS").unwrap_or(u64::MAX);
        if rss <= limit_kib || Instant::now() >= deadline {
            return rss;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The adapter's mappings holding more than 8 MiB (`start-end Rss`), to tell a buffer still
/// alive (one mapping of a request's size) from memory cached in malloc's arenas.
fn large_mappings(pid: u32) -> Vec<String> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut found = Vec::new();
    let mut range = "";
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            range = first;
        } else if first == "Rss:" {
            let kib: u64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if kib > 8 * 1024 {
                found.push(format!("{range} {:.1} MiB", mib(kib)));
            }
        }
    }
    found
}

struct Phase {
    name: &'static str,
    payload_mib: u64,
    idle_kib: u64,
    peak_kib: u64,
    after_kib: u64,
    /// What the SDK's connection may newly keep: the largest message of this phase, when it
    /// is larger than any before (the buffer only grows).
    read_buffer_kib: u64,
}

impl Phase {
    fn settled_limit_kib(&self) -> u64 {
        self.idle_kib + self.read_buffer_kib + SETTLED_SLACK_MIB * 1024
    }

    fn print(&self) {
        let delta = mib(self.peak_kib.saturating_sub(self.idle_kib));
        println!(
            "{:<28} payload {:>4} MiB | idle {:>6.1} MiB | peak {:>6.1} MiB (+{:>6.1}, {:.2}x payload) | after {:>6.1} MiB",
            self.name,
            self.payload_mib,
            mib(self.idle_kib),
            mib(self.peak_kib),
            delta,
            delta / self.payload_mib as f64,
            mib(self.after_kib),
        );
    }

    fn check(&self) {
        let delta = mib(self.peak_kib.saturating_sub(self.idle_kib));
        let allowed = PEAK_PER_PAYLOAD * self.payload_mib as f64;
        assert!(
            delta < allowed,
            "{}: peak {delta:.1} MiB above idle, over {allowed:.1} MiB ({PEAK_PER_PAYLOAD}x the {} MiB in flight)",
            self.name,
            self.payload_mib
        );
        let limit = self.settled_limit_kib();
        assert!(
            self.after_kib <= limit,
            "{}: VmRSS {:.1} MiB {} s after, over {:.1} MiB (idle {:.1} MiB + the SDK's read \
             buffer {:.1} MiB + {SETTLED_SLACK_MIB} MiB)",
            self.name,
            mib(self.after_kib),
            SETTLE_WITHIN.as_secs(),
            mib(limit),
            mib(self.idle_kib),
            mib(self.read_buffer_kib),
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn large_payloads_cost_a_small_multiple_and_memory_comes_back() {
    let test = "large_payloads_cost_a_small_multiple_and_memory_comes_back";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::start(json!({}), AdapterOptions::default()).await;
    let pid = stack.adapter.pid();
    let id = create(&stack, "python", json!({})).await;
    // A first exec and a small write: the sandbox's link and the code paths are warm.
    exec_ok(&stack, &id, json!({"argv": ["true"]})).await;
    fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/warm", "content": "x"}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let len = (PAYLOAD_MIB << 20) as usize;
    let contents: Vec<String> = (0..WRITERS)
        .map(|i| base64::engine::general_purpose::STANDARD.encode(noise(len, 0x9e37 + i)))
        .collect();
    let mut phases = Vec::new();
    // One request's JSON as the engine forwards it (the content plus a few hundred bytes).
    let message_kib = (contents[0].len() as u64 + 4096) / 1024;

    // Phase 1: four writes at once.
    let idle = status_kib(pid, "VmRSS").expect("adapter VmRSS");
    let resettable = reset_peak(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak(pid, Arc::clone(&stop));
    let writes = contents.iter().enumerate().map(|(i, b64)| {
        let payload = json!({"path": format!("/tmp/big{i}"), "content_b64": b64});
        fs_ok(&stack, "write", &id, payload)
    });
    let answers = futures::future::join_all(writes).await;
    for answer in &answers {
        assert_eq!(answer["bytes_written"], len as u64, "{answer}");
    }
    stop.store(true, Ordering::Relaxed);
    let peak = phase_peak(pid, resettable, sampler.join().expect("sampler"));
    let mut phase = Phase {
        name: "4 x fs::write content_b64",
        payload_mib: WRITERS * PAYLOAD_MIB,
        idle_kib: idle,
        peak_kib: peak,
        after_kib: 0,
        read_buffer_kib: message_kib,
    };
    phase.after_kib = settle(pid, phase.settled_limit_kib()).await;
    println!("after the writes: {:?}", large_mappings(pid));
    phases.push(phase);
    drop(answers);

    // The files hold what was sent (one checked whole, the others by size).
    let sizes = exec_ok(
        &stack,
        &id,
        json!({"argv": ["/bin/sh", "-c", "stat -c %s /tmp/big0 /tmp/big1 /tmp/big2 /tmp/big3"]}),
    )
    .await;
    let expected_size = format!("{len}\n").repeat(WRITERS as usize);
    assert_eq!(stdout(&sizes), expected_size, "{sizes}");

    // Phase 2: one exec with a large stdin (its program counts the bytes).
    let idle = status_kib(pid, "VmRSS").expect("adapter VmRSS");
    let resettable = reset_peak(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak(pid, Arc::clone(&stop));
    let counted = exec_ok(
        &stack,
        &id,
        json!({"argv": ["wc", "-c"], "stdin": contents[0]}),
    )
    .await;
    assert_eq!(stdout(&counted).trim(), len.to_string(), "{counted}");
    stop.store(true, Ordering::Relaxed);
    let peak = phase_peak(pid, resettable, sampler.join().expect("sampler"));
    let mut phase = Phase {
        name: "exec stdin",
        payload_mib: PAYLOAD_MIB,
        idle_kib: idle,
        peak_kib: peak,
        after_kib: 0,
        // No larger than the writes' messages: the buffer is there already.
        read_buffer_kib: 0,
    };
    phase.after_kib = settle(pid, phase.settled_limit_kib()).await;
    println!("after the exec: {:?}", large_mappings(pid));
    phases.push(phase);

    println!(
        "\nadapter memory on large payloads ({PAYLOAD_MIB} MiB each; peak {}):",
        if resettable {
            "VmHWM, reset before each phase"
        } else {
            "VmRSS sampled every 5 ms (VmHWM cannot be reset here)"
        }
    );
    for phase in &phases {
        phase.print();
    }
    println!();
    for phase in &phases {
        phase.check();
    }
}
