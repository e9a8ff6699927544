//! The boundary follows the host's addresses while sandboxes run. An address the host gains
//! after a sandbox started (a DHCP or SLAAC renewal, a VPN, a cloud's secondary address; here
//! 198.51.100.7/32 on `lo` and 2001:db8::7 on a veth pair of this test's) leads to every
//! service listening on the host's wildcard address, an engine on 0.0.0.0 among them. Each
//! sandbox's gate must refuse it, the running sandbox's and a new one's alike, within a
//! measured bound, and release it once the host no longer has it.
//!
//! TEST-NET-2 is in no default-denied range: only the gate's set of the host's addresses
//! stands between a sandbox and the bait. bwrap's gate; a libkrun runner's namespace is
//! filled by the same resolver proxy code (`egress/src/host_watch.rs`).

mod sandbox_support;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{create, exec_ok};
use serde_json::json;

const ADDED_V4: &str = "198.51.100.7";
const ADDED_V6: &str = "2001:db8::7";
/// How long a change may take to reach every gate's set. The measured times are printed
/// (a few milliseconds: one `nft` run per gate); the bound leaves room for a loaded machine.
const BOUND: Duration = Duration::from_secs(2);

/// Connects to each `host port` given and prints `host port verdict`; first `ipv6 yes` or
/// `ipv6 no`: whether the sandbox has an IPv6 default route (its starter gives it one only
/// where pasta got one from the host).
const PROBE: &str = r#"
import socket, sys
try:
    routes = open("/proc/net/ipv6_route").read().splitlines()
except OSError:
    routes = []
routed = any(l.startswith("0" * 32 + " 00 ") and not l.endswith(" lo") for l in routes)
print("ipv6", "yes" if routed else "no", flush=True)
for target in sys.argv[1:]:
    host, port = target.rsplit(" ", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect((host, int(port)))
        s.close()
        verdict = "connected"
    except ConnectionRefusedError:
        verdict = "refused"
    except socket.timeout:
        verdict = "timeout"
    except OSError as e:
        verdict = "error %s" % e.errno
    print(target, verdict, flush=True)
"#;

/// The addresses this test gave the host, removed when dropped (a failed assertion too).
struct AddedAddresses {
    link: String,
    v4: bool,
    v6: bool,
}

impl AddedAddresses {
    /// A veth pair named after this process (the kernel here may lack the dummy driver).
    fn new() -> AddedAddresses {
        let link = format!("iiiha{}", std::process::id() % 1_000_000);
        let _ = Command::new("ip")
            .args(["link", "del", &link])
            .stderr(Stdio::null())
            .status();
        ip(&[
            "link",
            "add",
            &link,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{link}p"),
        ]);
        ip(&["link", "set", &link, "up"]);
        AddedAddresses {
            link,
            v4: false,
            v6: false,
        }
    }

    fn add(&mut self) {
        ip(&["addr", "add", &format!("{ADDED_V4}/32"), "dev", "lo"]);
        self.v4 = true;
        ip(&[
            "addr",
            "add",
            &format!("{ADDED_V6}/128"),
            "dev",
            &self.link,
            "nodad",
        ]);
        self.v6 = true;
    }

    fn remove(&mut self) {
        if std::mem::take(&mut self.v4) {
            ip(&["addr", "del", &format!("{ADDED_V4}/32"), "dev", "lo"]);
        }
        if std::mem::take(&mut self.v6) {
            ip(&["addr", "del", &format!("{ADDED_V6}/128"), "dev", &self.link]);
        }
    }
}

impl Drop for AddedAddresses {
    fn drop(&mut self) {
        if self.v4 {
            let _ = Command::new("ip")
                .args(["addr", "del", &format!("{ADDED_V4}/32"), "dev", "lo"])
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
    }
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {args:?}");
}

/// The network namespaces of `stack`'s gates: each sandbox's resolver proxy lives in its own.
fn gates(stack: &Stack) -> Vec<u32> {
    sandbox_support::descendants(stack.adapter.pid())
        .into_iter()
        .filter(|p| p.comm == "iii-dns-proxy")
        .map(|p| p.pid)
        .collect()
}

/// The host's addresses the gate of `proxy`'s namespace refuses.
fn host_set(proxy: u32) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{proxy}/ns/net"))
        .args(["nft", "list", "set", "inet", "iii_egress", "host_v4"])
        .output()
        .expect("nsenter nft");
    let out6 = Command::new("nsenter")
        .arg(format!("--net=/proc/{proxy}/ns/net"))
        .args(["nft", "list", "set", "inet", "iii_egress", "host_v6"])
        .output()
        .expect("nsenter nft");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out6.stdout)
    )
}

/// Whether `address` is an element of the set listing (`198.51.100.7` is not `198.51.100.70`).
fn holds(listing: &str, address: &str) -> bool {
    listing
        .split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
        .any(|word| word == address)
}

/// Waits until every gate's set holds both added addresses (`present`) or neither; the time
/// it took from `since`, for each gate.
fn wait_for_sets(gates: &[u32], present: bool, since: Instant) -> Vec<Duration> {
    gates
        .iter()
        .map(|gate| loop {
            let listing = host_set(*gate);
            let done = [ADDED_V4, ADDED_V6]
                .iter()
                .all(|a| holds(&listing, a) == present);
            if done {
                break since.elapsed();
            }
            assert!(
                since.elapsed() < BOUND,
                "gate {gate}: the host's addresses {} not {} within {BOUND:?}:\n{listing}",
                if present { "were" } else { "were still" },
                if present { "refused" } else { "released" },
            );
            std::thread::sleep(Duration::from_millis(2));
        })
        .collect()
}

/// `host port verdict` for each target, from inside sandbox `id`.
async fn probe(stack: &Stack, id: &str, targets: &[String]) -> String {
    let mut argv = vec!["python3".to_string(), "-c".into(), PROBE.into()];
    argv.extend(targets.iter().cloned());
    let out = exec_ok(stack, id, json!({"argv": argv, "timeout_ms": 60_000})).await;
    let stdout = out["stdout"].as_str().unwrap_or_default().to_string();
    println!(
        "{id}:\n{stdout}{}",
        out["stderr"].as_str().unwrap_or_default()
    );
    stdout
}

fn accepted(baits: &[&TcpListener]) -> Vec<String> {
    baits
        .iter()
        .flat_map(|bait| std::iter::from_fn(|| bait.accept().ok()))
        .map(|(_, peer)| peer.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_address_the_host_gains_is_refused_to_every_sandbox_and_released_when_gone() {
    let test = "an_address_the_host_gains_is_refused_to_every_sandbox_and_released_when_gone";
    let tools = ["ip", "nsenter", "nft", "pasta"]
        .iter()
        .all(|tool| Command::new(tool).arg("--version").output().is_ok());
    if !nix::unistd::geteuid().is_root() || !tools {
        println!("\n*** {test} DID NOT RUN: needs root, iproute2, nsenter, nft and pasta ***\n");
        return;
    }
    if !bwrap_usable(test) {
        return;
    }
    // Services on the host's wildcard addresses, as an engine on 0.0.0.0 would listen.
    let bait_v4 = TcpListener::bind("0.0.0.0:0").expect("bait");
    let bait_v6 = TcpListener::bind("[::]:0").expect("bait");
    bait_v4.set_nonblocking(true).unwrap();
    bait_v6.set_nonblocking(true).unwrap();
    let targets = vec![
        format!("{ADDED_V4} {}", bait_v4.local_addr().unwrap().port()),
        format!("{ADDED_V6} {}", bait_v6.local_addr().unwrap().port()),
    ];

    let stack = Stack::bwrap().await;
    let running = create(&stack, "python", json!({"network": true})).await;
    let first_gate = gates(&stack);
    assert_eq!(first_gate.len(), 1, "one resolver proxy per sandbox");
    let before = host_set(first_gate[0]);
    assert!(
        !holds(&before, ADDED_V4) && !holds(&before, ADDED_V6),
        "{before}"
    );

    let mut added = AddedAddresses::new();
    added.add();
    let since = Instant::now();
    let took = wait_for_sets(&first_gate, true, since);
    println!("the running sandbox's gate refused the new addresses after {took:?}");
    let from_running = probe(&stack, &running, &targets).await;

    // A sandbox created while the host has them.
    let new = create(&stack, "python", json!({"network": true})).await;
    let all_gates = gates(&stack);
    assert_eq!(all_gates.len(), 2, "{all_gates:?}");
    wait_for_sets(&all_gates, true, Instant::now());
    let from_new = probe(&stack, &new, &targets).await;

    for (who, report) in [("running", &from_running), ("new", &from_new)] {
        for target in &targets {
            if target.starts_with(ADDED_V6) && report.contains("ipv6 no") {
                println!("the {who} sandbox has no IPv6 route: {target} judged by the set only");
                continue;
            }
            assert!(
                report.contains(&format!("{target} refused")),
                "the {who} sandbox was not refused {target} at once:\n{report}"
            );
        }
    }
    let heard = accepted(&[&bait_v4, &bait_v6]);
    assert!(heard.is_empty(), "a sandbox reached the host: {heard:?}");

    // Gone from the host: gone from every gate's set.
    added.remove();
    let since = Instant::now();
    let took = wait_for_sets(&all_gates, false, since);
    println!("the gates released the removed addresses after {took:?}");
    for gate in &all_gates {
        let listing = host_set(*gate);
        // The host's other addresses are still refused.
        assert!(holds(&listing, "127.0.0.1"), "{listing}");
    }
}
