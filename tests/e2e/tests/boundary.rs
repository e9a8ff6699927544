//! The network boundary, proved from the outside: frames built by hand past the sandbox's own
//! netfilter reach nothing of the host. A process with raw sockets (host root entering the
//! sandbox's network namespace, so the check proves the boundary rather than a missing
//! capability; and the sandbox's own root) sends hand-built Ethernet frames from a made-up
//! address of the sandbox's subnet (`frame_attack.py`) to bait sockets on the host's loopback
//! and the host's own address, and to the engine's port: none of them hears a thing, and no
//! TCP handshake is answered. A public address (a namespace this test makes) receives the same
//! frames, so the silence is the boundary's, not a broken network.
//!
//! bwrap only: a libkrun microVM with network has no network interface (TSI carries its
//! sockets), so there is no frame to send.

mod sandbox_support;
mod worker_support;

use std::net::{TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::veth::VethHost;
use sandbox_support::{create, exec};
use serde_json::json;
use worker_support::{compose_options, wait_log, worker_ok};

const ATTACK: &str = include_str!("frame_attack.py");
/// The "public" side: TEST-NET-3, in a namespace of this test's (network.rs uses TEST-NET-2).
const PUBLIC_HOST: &str = "203.0.113.1/24";
const PUBLIC: &str = "203.0.113.10";
const PUBLIC_CIDR: &str = "203.0.113.10/24";
const PUBLIC_PORT: u16 = 9999;

/// A namespace at [`PUBLIC`] with a UDP receiver on [`PUBLIC_PORT`] that prints what it gets.
struct PublicHost {
    receiver: Child,
    // Dropped after the receiver is stopped.
    _ns: VethHost,
}

impl PublicHost {
    fn start() -> PublicHost {
        let ns = VethHost::new(
            format!("iiib{}", std::process::id() % 100_000),
            &[(PUBLIC_HOST, PUBLIC_CIDR)],
        );
        ns.inside(&["route", "add", "default", "dev", &ns.ns_if]);
        let receiver = ns
            .command("python3")
            .args(["-u", "-c"])
            .arg(
                "import socket,sys\n\
                 s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                 s.bind(('0.0.0.0', int(sys.argv[1])))\n\
                 print('ready', flush=True)\n\
                 while True:\n    d,_=s.recvfrom(65535); print(d.decode(errors='replace'), flush=True)\n",
            )
            .arg(PUBLIC_PORT.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the receiver");
        PublicHost { receiver, _ns: ns }
    }

    /// Every line the receiver printed so far ("ready" first), after it is stopped.
    fn heard(mut self) -> String {
        let _ = self.receiver.kill();
        let mut out = String::new();
        if let Some(mut stdout) = self.receiver.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        }
        out
    }
}

impl Drop for PublicHost {
    fn drop(&mut self) {
        let _ = self.receiver.kill();
        let _ = self.receiver.wait();
    }
}

/// Sockets on the host that no sandbox may reach; each remembers what it heard.
struct Baits {
    tcp: Vec<TcpListener>,
    udp: Vec<UdpSocket>,
}

impl Baits {
    fn on(addresses: &[String]) -> Baits {
        let mut baits = Baits {
            tcp: Vec::new(),
            udp: Vec::new(),
        };
        for address in addresses {
            let tcp = TcpListener::bind((address.as_str(), 0)).expect("bait tcp");
            tcp.set_nonblocking(true).unwrap();
            let udp = UdpSocket::bind((address.as_str(), 0)).expect("bait udp");
            udp.set_nonblocking(true).unwrap();
            baits.tcp.push(tcp);
            baits.udp.push(udp);
        }
        baits
    }

    /// `(proto, ip, port)` of every bait.
    fn targets(&self) -> Vec<(String, String, u16)> {
        let tcp = self.tcp.iter().map(|l| ("tcp", l.local_addr().unwrap()));
        let udp = self.udp.iter().map(|s| ("udp", s.local_addr().unwrap()));
        tcp.chain(udp)
            .map(|(proto, a)| (proto.to_string(), a.ip().to_string(), a.port()))
            .collect()
    }

    /// What reached any bait: connections accepted and datagrams received.
    fn heard(&self) -> Vec<String> {
        let mut heard = Vec::new();
        for listener in &self.tcp {
            while let Ok((_, peer)) = listener.accept() {
                heard.push(format!(
                    "tcp {} accepted {peer}",
                    listener.local_addr().unwrap()
                ));
            }
        }
        for socket in &self.udp {
            let mut buffer = [0u8; 2048];
            while let Ok((n, peer)) = socket.recv_from(&mut buffer) {
                heard.push(format!(
                    "udp {} from {peer}: {}",
                    socket.local_addr().unwrap(),
                    String::from_utf8_lossy(&buffer[..n])
                ));
            }
        }
        heard
    }
}

/// An address of the host's own (not loopback, not a test namespace's).
fn host_address() -> Option<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains(" iii"))
        .find_map(|l| l.split_whitespace().nth(3))
        .and_then(|cidr| cidr.split('/').next().map(String::from))
}

/// A process of `stack`'s sandboxes, seen from the host: the adapter's descendant `bwrap`,
/// which runs in the sandbox's network namespace.
fn sandbox_process(stack: &Stack) -> Option<u32> {
    sandbox_support::descendants(stack.adapter.pid())
        .into_iter()
        .find(|p| p.comm == "bwrap")
        .map(|p| p.pid)
}

fn attack_args(targets: &[(String, String, u16)], token: &str) -> Vec<String> {
    let mut args = Vec::new();
    for (proto, ip, port) in targets {
        args.extend([
            proto.clone(),
            ip.clone(),
            port.to_string(),
            token.to_string(),
        ]);
    }
    args
}

/// Lines `PROTO IP:PORT verdict` whose verdict is not `silent`.
fn answered(report: &str) -> Vec<&str> {
    report
        .lines()
        .filter(|l| !l.starts_with('#') && !l.ends_with(" silent"))
        .collect()
}

/// The tests of this file share the public address: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether this host can run the attack; says why not.
fn attack_usable(test: &str) -> bool {
    let tools = ["ip", "nsenter", "python3", "pasta"]
        .iter()
        .all(|tool| Command::new(tool).arg("--version").output().is_ok());
    if !nix::unistd::geteuid().is_root() || !tools {
        println!(
            "\n*** {test} DID NOT RUN: needs root, iproute2, nsenter, python3 and pasta ***\n"
        );
        return false;
    }
    bwrap_usable(test)
}

/// The baits on the host's loopback and own address, and the engine's port there.
fn host_targets(stack: &Stack) -> (Baits, Vec<(String, String, u16)>) {
    let mut addresses = vec!["127.0.0.1".to_string()];
    addresses.extend(host_address());
    let baits = Baits::on(&addresses);
    let engine_port: u16 = stack
        .engine
        .url()
        .rsplit_once(':')
        .and_then(|(_, port)| port.trim_end_matches('/').parse().ok())
        .expect("the engine's port");
    let mut targets = baits.targets();
    for address in &addresses {
        targets.push(("tcp".into(), address.clone(), engine_port));
    }
    (baits, targets)
}

/// The attack on `targets` (and a control datagram to the public address) from host root
/// inside the network namespace of `pid`: its report.
fn attack_from_host_root(pid: u32, targets: &[(String, String, u16)]) -> String {
    let mut args = attack_args(targets, "from-host-root");
    args.extend(attack_args(
        &[("udp".into(), PUBLIC.into(), PUBLIC_PORT)],
        "control-from-host-root",
    ));
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["python3", "-c", ATTACK])
        .args(&args)
        .output()
        .expect("run the attack");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "as host root:\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the attack itself failed to run");
    report
}

/// Nothing reached a bait nor answered a handshake, and the public address heard the
/// control (so the silence is the boundary's, not a broken network).
fn assert_nothing_reached(baits: &Baits, public: PublicHost, reports: &[&str]) {
    std::thread::sleep(Duration::from_millis(300));
    let heard = baits.heard();
    let control = public.heard();
    assert!(
        heard.is_empty(),
        "hand-built frames reached the host: {heard:?}"
    );
    for report in reports {
        assert!(
            answered(report).is_empty(),
            "a host port answered a handshake: {:?}",
            answered(report)
        );
    }
    assert!(
        control.contains("control-from-host-root"),
        "the public address did not receive the control frames (the network is broken, so the \
         silence above proves nothing): {control:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hand_built_frames_reach_nothing_of_the_host() {
    if !attack_usable("hand_built_frames_reach_nothing_of_the_host") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let public = PublicHost::start();
    let stack = Stack::bwrap().await;
    let (baits, targets) = host_targets(&stack);
    let id = create(&stack, "python", json!({"network": true})).await;
    let pid = sandbox_process(&stack).expect("the sandbox's bwrap on the host");
    let report = attack_from_host_root(pid, &targets);

    // As the sandbox's root: refused raw sockets, or frames that reach nothing.
    let mut argv = vec!["python3".to_string(), "-c".into(), ATTACK.into()];
    argv.extend(attack_args(&targets, "from-the-sandbox"));
    let inside = exec(&stack, &id, json!({"argv": argv, "timeout_ms": 60_000}))
        .await
        .expect("exec");
    let inside_out = inside["stdout"].as_str().unwrap_or_default().to_string();
    println!(
        "as the sandbox's root: exit {} {inside_out}{}",
        inside["exit_code"],
        inside["stderr"].as_str().unwrap_or_default()
    );
    assert_nothing_reached(&baits, public, &[&report, &inside_out]);
}

/// A worker VM reaches the engine through its one forward (a connection to its own
/// loopback's port), never by frames: the same attack from its namespace reaches nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_vms_frames_reach_nothing_of_the_host() {
    if !attack_usable("a_worker_vms_frames_reach_nothing_of_the_host") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let public = PublicHost::start();
    let project = e2e_tests::host_dir();
    let stack = Stack::start(json!({}), compose_options(project.path())).await;
    let (baits, targets) = host_targets(&stack);
    worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": "frames", "image": "python", "host_path": project.path()}),
    )
    .await;
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": "frames", "command": ["sh", "-c", "echo up; exec sleep 600"]}),
    )
    .await;
    wait_log(&stack, "frames", "up", 1, Duration::from_secs(60)).await;
    let pid = sandbox_process(&stack).expect("the worker's bwrap on the host");
    let report = attack_from_host_root(pid, &targets);
    assert_nothing_reached(&baits, public, &[&report]);
    worker_ok(&stack, "stop", json!({"vm_id": "frames"})).await;
}
