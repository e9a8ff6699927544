//! `metrics` end to end on the bwrap backend: a sandbox that allocates 100 MiB, writes
//! 50 MiB into its layer, burns CPU and downloads 20 MiB from a test server shows each
//! counter move by about that much; a paused sandbox answers without being resumed.

mod sandbox_support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::veth::VethHost;
use sandbox_support::{create, eventually, exec_ok, expect_err, sh, stdout, stop};
use serde_json::{json, Value};

const MIB: u64 = 1024 * 1024;
const PORT: u16 = 8080;
/// The public side network.rs serves too (its tests run in another test binary, never at
/// the same time as this one).
const SERVER: &str = "198.51.100.10";

/// A network namespace with a veth to the host and a server on `PORT` that sends 20 MiB to
/// each connection (one that closes early, as the readiness probe does, is skipped);
/// removed when dropped.
struct DownloadHost {
    server: Child,
    // Dropped after the server is stopped.
    _ns: VethHost,
}

impl DownloadHost {
    fn start() -> DownloadHost {
        let ns = VethHost::new(
            format!("iiim{}", std::process::id() % 100_000),
            &[("198.51.100.1/24", &format!("{SERVER}/24"))],
        );
        let server = ns
            .command("python3")
            .arg("-c")
            .arg(
                "import socket,sys\n\
                 s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                 s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(8)\n\
                 block=b'x'*(1<<20)\n\
                 while True:\n    c,_=s.accept()\n    try:\n        [c.sendall(block) for _ in range(20)]\n    except OSError:\n        pass\n    c.close()\n",
            )
            .arg(PORT.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the test server");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect((SERVER, PORT)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the test server never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        DownloadHost { server, _ns: ns }
    }
}

impl Drop for DownloadHost {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

async fn metrics(stack: &Stack, id: &str) -> Value {
    stack
        .call("metrics", json!({"sandbox_id": id}))
        .await
        .unwrap_or_else(|e| panic!("metrics: {e:?}\n{}", stack.adapter.log()))
}

fn field(m: &Value, key: &str) -> u64 {
    m[key]
        .as_u64()
        .unwrap_or_else(|| panic!("metrics.{key} is a number on bwrap: {m}"))
}

/// Whether `after - before` of `key` is within [low, high] MiB.
fn moved(before: &Value, after: &Value, key: &str, low: u64, high: u64) {
    let delta = field(after, key).saturating_sub(field(before, key));
    assert!(
        (low * MIB..=high * MIB).contains(&delta),
        "{key} moved by {} MiB, expected {low}..{high}: before {before}, after {after}",
        delta / MIB
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_follow_memory_disk_cpu_and_network_use() {
    let test = "metrics_follow_memory_disk_cpu_and_network_use";
    let root = nix::unistd::geteuid().is_root();
    let tools = Command::new("ip").arg("-V").output().is_ok()
        && Command::new("pasta").arg("--version").output().is_ok();
    if !root || !tools {
        println!("\n*** {test} DID NOT RUN: needs root and iproute2 for the test's server namespace, and pasta ***\n");
        return;
    }
    if !bwrap_usable(test) {
        return;
    }
    let _server = DownloadHost::start();
    let stack = Stack::start(json!({"default_memory_mb": 512}), Default::default()).await;
    let id = create(
        &stack,
        "python",
        json!({"network": true, "idle_timeout_secs": 600}),
    )
    .await;
    let before = metrics(&stack, &id).await;
    assert!(field(&before, "pids") >= 1, "{before}");
    assert!(field(&before, "uptime_ms") < 600_000, "{before}");

    // 100 MiB held by a program that stays, touched so it is resident.
    exec_ok(
        &stack,
        &id,
        sh("python3 -c 'import time\nb = bytearray(100 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nopen(\"/tmp/held\", \"w\").close()\ntime.sleep(600)' </dev/null >/dev/null 2>&1 &"),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            stdout(&exec_ok(&stack, &id, sh("test -e /tmp/held && echo yes")).await) == "yes\n"
        })
        .await,
        "the allocating program never got there"
    );
    let allocated = metrics(&stack, &id).await;
    moved(&before, &allocated, "memory_bytes", 95, 140);
    assert!(field(&allocated, "memory_peak_bytes") >= field(&allocated, "memory_bytes"));
    assert!(field(&allocated, "pids") >= 2, "{allocated}");

    // 50 MiB into the layer.
    exec_ok(
        &stack,
        &id,
        sh("dd if=/dev/zero of=/tmp/fifty bs=1M count=50 2>/dev/null"),
    )
    .await;
    let written = metrics(&stack, &id).await;
    moved(&allocated, &written, "disk_bytes", 49, 55);

    // About a second of CPU.
    exec_ok(&stack, &id, sh("python3 -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass'")).await;
    let burnt = metrics(&stack, &id).await;
    let cpu = field(&burnt, "cpu_ms") - field(&written, "cpu_ms");
    assert!(
        (900..5000).contains(&cpu),
        "cpu_ms moved by {cpu}: {written} -> {burnt}"
    );

    // 20 MiB downloaded.
    let got = exec_ok(
        &stack,
        &id,
        sh(&format!("python3 -c 'import socket\ns = socket.create_connection((\"{SERVER}\", {PORT}), timeout=30)\nn = 0\nwhile True:\n    d = s.recv(1 << 16)\n    if not d: break\n    n += len(d)\nprint(n)'")),
    )
    .await;
    assert_eq!(stdout(&got).trim(), (20 * MIB).to_string(), "{got}");
    let downloaded = metrics(&stack, &id).await;
    moved(&burnt, &downloaded, "net_rx_bytes", 20, 23);
    let sent = field(&downloaded, "net_tx_bytes") - field(&burnt, "net_tx_bytes");
    assert!(sent < 5 * MIB, "acknowledgements only: {sent} bytes sent");
    assert!(field(&downloaded, "uptime_ms") > field(&before, "uptime_ms"));
    for (step, m) in [
        ("created", &before),
        ("100 MiB held", &allocated),
        ("50 MiB written", &written),
        ("1 s of CPU", &burnt),
        ("20 MiB downloaded", &downloaded),
    ] {
        println!("metrics after {step}: {m}");
    }

    // A paused sandbox answers without being resumed.
    if stack.call("pause", json!({"sandbox_id": id})).await.is_ok() {
        let paused = metrics(&stack, &id).await;
        assert!(field(&paused, "memory_bytes") > 100 * MIB, "{paused}");
        let list = stack.call("list", json!({})).await.expect("list");
        let entry = list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sandbox_id"] == id)
            .cloned();
        assert_eq!(
            entry.map(|e| e["paused"].clone()),
            Some(json!(true)),
            "{list}"
        );
    }
    stop(&stack, &id, true).await;
    let (code, _) = expect_err(
        stack.call("metrics", json!({"sandbox_id": id})).await,
        "metrics of a stopped sandbox",
    );
    assert_eq!(code, "S004");
}
