//! What the agent adds over running a program directly, measured in one process:
//! agent start to ready, an exec of `/bin/true`, and draining a large output.
//! Set SANDBOX_AGENT_BIN to measure the static build; otherwise cargo's build is used.

mod common;

use common::{agent_bin, median, start_agent};

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_proto::ExecSpec;

const RUNS: usize = 200;
const BIG: u64 = 256 * 1024 * 1024;

fn spec(argv: &[&str]) -> ExecSpec {
    ExecSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        timeout_ms: 60_000,
        max_output_bytes: 1024 * 1024,
        ..ExecSpec::default()
    }
}

fn direct_true() -> Duration {
    let t = Instant::now();
    Command::new("/bin/true").status().expect("true runs");
    t.elapsed()
}

fn direct_drain() -> Duration {
    let t = Instant::now();
    let mut child = Command::new("head")
        .args(["-c", &BIG.to_string(), "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("head runs");
    let mut out = child.stdout.take().expect("out");
    let mut buf = vec![0u8; 64 * 1024];
    while out.read(&mut buf).expect("read") > 0 {}
    child.wait().expect("wait");
    t.elapsed()
}

fn row(name: &str, ours: Duration, base: Duration, base_name: &str) {
    let ratio = ours.as_secs_f64() / base.as_secs_f64();
    let added = ours.as_secs_f64() * 1e3 - base.as_secs_f64() * 1e3;
    println!(
        "| {name:<34} | {:>9.3} | {base_name:<28} | {:>9.3} | {ratio:>6.2}x | {added:>+8.3} |",
        ours.as_secs_f64() * 1e3,
        base.as_secs_f64() * 1e3
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("agent: {}", agent_bin());
    println!(
        "| {:<34} | {:>9} | {:<28} | {:>9} | {:>7} | {:>8} |",
        "measure (median)", "ms", "baseline (same run)", "ms", "ratio", "added ms"
    );
    println!(
        "|{:-<36}|{:-<11}|{:-<30}|{:-<11}|{:-<9}|{:-<10}|",
        "", "", "", "", "", ""
    );

    let base_true = median((0..RUNS).map(|_| direct_true()).collect());

    let mut starts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let (client, mut child) = start_agent().await;
        starts.push(t.elapsed());
        client.shutdown().await.expect("shutdown");
        child.wait().await.expect("exit");
    }
    row(
        "agent spawn + hello",
        median(starts),
        base_true,
        "spawn+wait /bin/true",
    );

    let (client, _child) = start_agent().await;
    let mut execs = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        client.exec(spec(&["/bin/true"])).await.expect("exec");
        execs.push(t.elapsed());
    }
    row(
        "exec /bin/true via agent",
        median(execs),
        base_true,
        "spawn+wait /bin/true",
    );

    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let c = client.clone();
        set.spawn(async move {
            for _ in 0..(RUNS / 8) {
                c.exec(spec(&["/bin/true"])).await.expect("exec");
            }
        });
    }
    while set.join_next().await.is_some() {}
    let per_exec = t.elapsed() / RUNS as u32;
    row(
        "exec /bin/true, 8 parallel (each)",
        per_exec,
        base_true,
        "spawn+wait /bin/true",
    );

    let base_drain = median((0..3).map(|_| direct_drain()).collect());
    let mut drains = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let out = client
            .exec(spec(&["head", "-c", &BIG.to_string(), "/dev/zero"]))
            .await
            .expect("exec");
        assert!(out.stdout_truncated);
        drains.push(t.elapsed());
    }
    row(
        "drain 256 MiB stdout (cap 1 MiB)",
        median(drains),
        base_drain,
        "read 256 MiB pipe directly",
    );
}
