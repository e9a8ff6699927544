//! Networking that never opens the bus, on the bwrap plugin, and on the libkrun
//! plugin's microVMs where `SANDBOX_E2E_NETWORK_PLUGIN=libkrun` (the VM lab runs it so): every
//! sandbox has a network namespace of its own; `network: true` reaches "public" addresses
//! through pasta and is refused, at once, for the host's loopback, private, link-local and
//! metadata addresses and the engine; `network_allow` / `network_deny` and a create's
//! `network` object narrow the policy; a worker VM reaches the engine (registers a function a
//! host caller calls) and nothing else of the host's loopback. Host names: the sandbox's DNS
//! goes to our resolver proxy whatever server it asks, resolves through the resolvers
//! `network_dns` names, and a name in `network_deny` / `network_allow` judges the addresses it
//! resolved to; a flood of malformed queries leaves the proxy answering.
//!
//! The servers live in network namespaces this test makes (`ip netns`, veth): a "public" one
//! at 198.51.100.10 (and .11 for the name tests) and a "private" one at 10.199.0.10,
//! 192.168.199.10 and 169.254.77.10 (link-local); 169.254.169.254 (metadata) is probed with no
//! server behind it. The names are served by `dns_server.py` on the host's loopback.

mod sandbox_support;
mod worker_support;

use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use e2e_tests::{bwrap_usable, AdapterOptions, Stack};
use sandbox_support::veth::VethHost;
use sandbox_support::{create, exec_ok, expect_err, stdout};
use serde_json::{json, Value};
use worker_support::{compose_options, wait_log, worker_ok};

const WORKER: &str = include_str!("iii_worker.py");
const DNS_SERVER: &str = include_str!("dns_server.py");
const PORT: u16 = 8080;
const PUBLIC: &str = "198.51.100.10";
const PRIVATE: [&str; 3] = ["10.199.0.10", "192.168.199.10", "169.254.77.10"];
/// The cloud metadata address: refused by the policy before any packet leaves (no server
/// stands there: this host routes it elsewhere).
const METADATA: &str = "169.254.169.254:80";

/// A network namespace with a veth to the host and a TCP server on `PORT` that greets with
/// `banner`; removed when dropped.
struct TestHost {
    server: Child,
    // Dropped after the server is stopped.
    veth: VethHost,
}

impl TestHost {
    /// `pairs`: (host side, namespace side) addresses of the veth.
    fn start(tag: &str, pairs: &[(&str, &str)], banner: &str) -> TestHost {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let veth = VethHost::new(format!("iii{tag}{}{n}", std::process::id() % 10_000), pairs);
        let server = veth
            .command("python3")
            .arg("-c")
            .arg(
                "import socket,sys\n\
                 s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                 s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(64)\n\
                 while True:\n    c,_=s.accept(); c.sendall(sys.argv[2].encode()+b'\\n'); c.close()\n",
            )
            .args([&PORT.to_string(), banner])
            .stdout(Stdio::null())
            .spawn()
            .expect("start the test server");
        let mut host = TestHost { server, veth };
        // The fixture itself works from the host: a refusal later is the policy's.
        for (_, inside) in pairs {
            let address = inside.split('/').next().unwrap();
            host.wait_served(address, banner);
        }
        host
    }

    /// Another address of the namespace's side (same subnet as the first), served too.
    fn add_address(&mut self, cidr: &str, banner: &str) {
        self.veth
            .inside(&["addr", "add", cidr, "dev", &self.veth.ns_if]);
        self.veth.route_here(cidr.split('/').next().unwrap());
        self.wait_served(cidr.split('/').next().unwrap(), banner);
    }

    /// Waits until the server answers the host at `address`. Generous: python3 takes several
    /// seconds to start under the VM lab's emulated CPU (5 s were too few in a CI run); it
    /// returns as soon as the server answers, and at once if the server died.
    fn wait_served(&mut self, address: &str, banner: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let mut last_error = String::new();
        while std::time::Instant::now() < deadline {
            match std::net::TcpStream::connect((address, PORT)) {
                Ok(mut s) => {
                    let mut text = String::new();
                    let _ = std::io::Read::read_to_string(&mut s, &mut text);
                    assert_eq!(text.trim(), banner);
                    return;
                }
                Err(e) => last_error = e.to_string(),
            }
            if let Ok(Some(status)) = self.server.try_wait() {
                panic!("the test server for {address}:{PORT} exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the test server at {address}:{PORT} never answered the host in 90 s: {last_error}");
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The tests of this file share the test servers' addresses: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether this host lets the test make network namespaces (root, iproute2); says why not.
fn netns_usable(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    let ip = Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    let pasta = Command::new("pasta").arg("--version").output().is_ok();
    if !(root && ip && pasta) {
        println!("\n*** {test} DID NOT RUN: needs root and iproute2 for the test's namespaces, and pasta ***\n");
    }
    root && ip && pasta && bwrap_usable(test)
}

fn public_host() -> TestHost {
    TestHost::start(
        "p",
        &[("198.51.100.1/24", "198.51.100.10/24")],
        "hello-public",
    )
}

fn private_host() -> TestHost {
    TestHost::start(
        "q",
        &[
            ("10.199.0.1/24", "10.199.0.10/24"),
            ("192.168.199.1/24", "192.168.199.10/24"),
            ("169.254.77.1/24", "169.254.77.10/24"),
        ],
        "hello-private",
    )
}

/// Probes `targets` (`host:port`) from sandbox `id`; each line's verdict word by target.
async fn probe(stack: &Stack, id: &str, targets: &[String]) -> Vec<(String, String)> {
    let mut argv = vec![
        "python3".to_string(),
        "-c".into(),
        WORKER.into(),
        "probe".into(),
    ];
    for target in targets {
        let (host, port) = target.rsplit_once(':').unwrap();
        argv.extend([host.to_string(), port.to_string()]);
    }
    let answer = exec_ok(stack, id, json!({ "argv": argv, "timeout_ms": 120_000 })).await;
    println!("{}", stdout(&answer));
    stdout(&answer)
        .lines()
        .map(|line| {
            let mut words = line.split_whitespace();
            let target = words.next().unwrap_or_default().to_string();
            (target, words.collect::<Vec<_>>().join(" "))
        })
        .collect()
}

fn verdict<'a>(results: &'a [(String, String)], target: &str) -> &'a str {
    results
        .iter()
        .find(|(t, _)| t == target)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no result for {target}: {results:?}"))
}

fn assert_refused(results: &[(String, String)], target: &str) {
    let v = verdict(results, target);
    assert!(
        v.starts_with("refused"),
        "{target} must be refused at once, got {v}"
    );
}

fn public() -> String {
    format!("{PUBLIC}:{PORT}")
}

#[tokio::test(flavor = "multi_thread")]
async fn network_on_reaches_the_public_side_only_and_off_reaches_nothing() {
    if !netns_usable("network_on_reaches_the_public_side_only_and_off_reaches_nothing") {
        return;
    }
    let _serial = SERIAL.lock().await;
    earlier_sandboxes_gone().await;
    let _public = public_host();
    let _private = private_host();
    // A server on the host's loopback, and the engine: neither may be reached.
    let loopback = TcpListener::bind("127.0.0.1:0").unwrap();
    let loopback = format!("127.0.0.1:{}", loopback.local_addr().unwrap().port());
    let stack = plugin_under_test().await;
    let engine = stack.engine.url().replace("ws://", "");
    let host_ip = host_address();
    let mut targets = vec![public(), loopback.clone(), engine.clone()];
    targets.extend(PRIVATE.iter().map(|ip| format!("{ip}:{PORT}")));
    targets.push(METADATA.into());
    if let Some(ip) = &host_ip {
        targets.push(format!("{ip}:{}", engine.rsplit_once(':').unwrap().1));
    }

    let on = create(&stack, "python", json!({"network": true})).await;
    let results = probe(&stack, &on, &targets).await;
    assert_eq!(verdict(&results, &public()), "ok hello-public");
    for target in &targets[1..] {
        assert_refused(&results, target);
    }
    ping_public(&stack, &on).await;
    // pasta ends with its sandbox (this file's tests run one at a time, and no other sandbox
    // of this stack has network).
    assert_eq!(
        pasta_processes(),
        1,
        "one pasta for the one sandbox with network"
    );
    sandbox_support::stop(&stack, &on, true).await;
    let gone =
        sandbox_support::eventually(Duration::from_secs(5), || async { pasta_processes() == 0 })
            .await;
    assert!(gone, "pasta outlived its sandbox");

    let off = create(&stack, "python", json!({})).await;
    let results = probe(&stack, &off, &targets).await;
    for (target, v) in &results {
        assert!(!v.starts_with("ok"), "network off reached {target}: {v}");
    }
    assert!(verdict(&results, &public()).starts_with("unreachable"));
    let links = exec_ok(&stack, &off, json!({"argv": ["cat", "/proc/net/dev"]})).await;
    // libkrunfw's guest kernel makes `dummy0` itself: a device with no address or route
    // (every probe above was unreachable), not a way out.
    let interfaces: Vec<&str> = stdout(&links)
        .lines()
        .skip(2)
        .map(|l| l.trim())
        .filter(|l| !(libkrun_under_test() && l.starts_with("dummy0:")))
        .collect();
    assert!(
        interfaces.len() == 1 && interfaces[0].starts_with("lo:"),
        "network off has only lo: {interfaces:?}"
    );
}

/// An echo request over an ICMP datagram socket, the way `ping` sends without raw sockets
/// (iputils' ping, and Alpine's busybox; upstream busybox's, the fixture's, asks for a raw
/// socket only): "socket ok", then "reply from ADDRESS" or what went wrong.
const PING: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
print("socket ok", flush=True)
s.settimeout(5)
# Type 8 (echo request); the kernel fills in the checksum and the identifier.
s.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"iii-ping", (sys.argv[1], 0))
try:
    data, peer = s.recvfrom(1024)
    print(("reply from " if data[0] == 0 else f"icmp type {data[0]} from ") + peer[0])
except OSError as e:
    print(f"no reply: {e}")
"#;

/// Ping works without raw sockets: the agent opens ping_group_range to the sandbox's
/// groups, so an ICMP datagram socket opens, and its echo request is judged by the egress
/// rules like any other packet. pasta sends it on with an ICMP socket of its own on the
/// host, which the host's ping_group_range must let pasta's group open.
async fn ping_public(stack: &Stack, id: &str) {
    let answer = exec_ok(
        stack,
        id,
        json!({"argv": ["python3", "-c", PING, PUBLIC], "timeout_ms": 30_000}),
    )
    .await;
    println!("ping {PUBLIC}: {}", stdout(&answer));
    let shown = format!("{answer}\n{}", stack.adapter.log());
    if libkrun_under_test() {
        println!(
            "\n*** ping DID NOT RUN: ICMP datagram sockets through libkrun's TSI are \
             unmeasured ***\n{answer}\n"
        );
        return;
    }
    assert!(
        stdout(&answer).starts_with("socket ok\n"),
        "no ICMP datagram socket in the sandbox: {shown}"
    );
    if let Err(why) = pasta_may_ping() {
        println!("\n*** ping's echo reply DID NOT RUN: {why} ***\n{answer}\n");
        return;
    }
    assert!(
        stdout(&answer).contains(&format!("reply from {PUBLIC}\n")),
        "ping {PUBLIC}: {shown}"
    );
}

/// Whether the host's ping_group_range holds the group of the one pasta running.
fn pasta_may_ping() -> Result<(), String> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ping_group_range")
        .map_err(|e| format!("the host's ping_group_range: {e}"))?;
    let bounds: Vec<u64> = range
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let [low, high] = bounds[..] else {
        return Err(format!("the host's ping_group_range holds {range:?}"));
    };
    let pasta_gid = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| cmdline.starts_with(b"/usr/bin/pasta\0"))
        })
        .find_map(|entry| {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("Gid:"))?;
            line.split_whitespace().nth(2)?.parse::<u64>().ok()
        })
        .ok_or("no pasta runs")?;
    if (low..=high).contains(&pasta_gid) {
        Ok(())
    } else {
        Err(format!(
            "the host's ping_group_range ({}) leaves pasta's group {pasta_gid} out: pasta \
             cannot answer ICMP",
            range.trim()
        ))
    }
}

fn libkrun_under_test() -> bool {
    std::env::var("SANDBOX_E2E_NETWORK_PLUGIN").is_ok_and(|p| p == "libkrun")
}

/// `options` on the plugin under test: as they are for bwrap, the libkrun plugin (under its
/// own adapter name) where `SANDBOX_E2E_NETWORK_PLUGIN=libkrun`.
fn on_plugin_under_test(mut options: AdapterOptions) -> AdapterOptions {
    if libkrun_under_test() {
        options.plugin = e2e_tests::PluginKind::Libkrun;
        options.prefix = None;
    }
    options
}

/// The stack of the tests: bwrap, or the libkrun plugin's microVMs where
/// `SANDBOX_E2E_NETWORK_PLUGIN=libkrun` (the VM lab runs that test so: the same promises on
/// both backends).
async fn plugin_under_test() -> Stack {
    if libkrun_under_test() {
        let stack = Stack::start(json!({}), on_plugin_under_test(Default::default())).await;
        let info = stack.call("adapter::info", json!({})).await.expect("info");
        assert_eq!(
            info["backend"]["ready"], true,
            "libkrun must boot here: {info}"
        );
        return stack;
    }
    Stack::bwrap().await
}

/// How many pasta processes this test process's adapters run (other adapters on the host,
/// other tests' or users', are not counted).
fn pasta_processes() -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| cmdline.starts_with(b"/usr/bin/pasta\0"))
        })
        .filter(|entry| of_this_test(&entry.file_name().to_string_lossy()))
        .count()
}

/// Whether process `pid` descends from this test process, where its adapters run. The test
/// process is made its descendants' subreaper on first use, so a process whose parent died
/// (a leaked pasta or proxy) is handed to it, not to init, and still counts as ours.
fn of_this_test(pid: &str) -> bool {
    static SUBREAPER: std::sync::Once = std::sync::Once::new();
    SUBREAPER.call_once(|| {
        let _ = nix::sys::prctl::set_child_subreaper(true);
    });
    let me = std::process::id();
    let mut pid: u32 = pid.parse().unwrap_or(0);
    // A chain longer than this is a loop read across exits: not ours.
    for _ in 0..64 {
        if pid == me {
            return true;
        }
        match sandbox_support::HostProcess::read(pid) {
            Some(process) if process.ppid > 1 => pid = process.ppid,
            _ => return false,
        }
    }
    false
}

/// An address of the host's own (not loopback): a sandbox must not reach host services
/// through it either.
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

#[tokio::test(flavor = "multi_thread")]
async fn allow_and_deny_narrow_the_policy_and_a_create_cannot_widen_it() {
    if !netns_usable("allow_and_deny_narrow_the_policy_and_a_create_cannot_widen_it") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let _public = public_host();
    let _private = private_host();
    let private = format!("{}:{PORT}", PRIVATE[0]);

    // network_deny takes a public address away.
    let stack = Stack::start(
        json!({"network_deny": [PUBLIC]}),
        on_plugin_under_test(AdapterOptions::default()),
    )
    .await;
    let id = create(&stack, "python", json!({"network": true})).await;
    let results = probe(&stack, &id, &[public()]).await;
    assert_refused(&results, &public());
    drop(stack);

    // network_allow: only its ranges, which may be private on purpose.
    let stack = Stack::start(
        json!({"network_allow": ["10.199.0.0/24"]}),
        on_plugin_under_test(AdapterOptions::default()),
    )
    .await;
    let id = create(&stack, "python", json!({"network": true})).await;
    let results = probe(&stack, &id, &[public(), private.clone()]).await;
    assert_eq!(verdict(&results, &private), "ok hello-private");
    assert_refused(&results, &public());
    drop(stack);

    // A create's object narrows; it cannot widen.
    let stack = plugin_under_test().await;
    let id = create(
        &stack,
        "python",
        json!({"network": {"deny": ["198.51.100.0/24"]}}),
    )
    .await;
    let results = probe(&stack, &id, &[public()]).await;
    assert_refused(&results, &public());
    for (wider, what) in [
        (json!({"allow": ["10.0.0.0/8"]}), "a private range"),
        (json!({"allow": ["0.0.0.0/0"]}), "everything"),
        (json!({"allowed": []}), "an unknown field"),
        (json!("yes"), "a string"),
    ] {
        let refused = stack
            .call("create", json!({"image": "python", "network": wider}))
            .await;
        let (code, body) = expect_err(refused, what);
        assert_eq!(code, "S001", "{what}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_cannot_reach_the_bus_but_a_worker_vm_can_and_nothing_else() {
    if !netns_usable("a_sandbox_cannot_reach_the_bus_but_a_worker_vm_can_and_nothing_else") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let _public = public_host();
    let _private = private_host();
    let project = e2e_tests::host_dir();
    std::fs::File::create(project.path().join("worker.py"))
        .unwrap()
        .write_all(WORKER.as_bytes())
        .unwrap();
    let stack = Stack::start(
        json!({}),
        on_plugin_under_test(compose_options(project.path())),
    )
    .await;
    let before = functions(&stack).await;

    // The attack: a sandbox with network tries to register a function on the bus.
    let id = create(&stack, "python", json!({"network": true})).await;
    let attack = exec_ok(
        &stack,
        &id,
        json!({"argv": ["python3", "-c", WORKER, "serve", "attacker::pwned", "pwned"],
               "env": {"III_URL": stack.engine.url()}, "timeout_ms": 30_000}),
    )
    .await;
    assert!(
        stdout(&attack).contains("cannot reach the engine"),
        "the sandbox reached the engine: {attack}"
    );
    let after = functions(&stack).await;
    assert!(
        !after.iter().any(|f| f.starts_with("attacker::")),
        "{after:?}"
    );
    assert_eq!(before.len(), after.len(), "no function appeared");

    // A worker VM: its III_URL reaches the engine, where a host caller calls it.
    worker_ok(
        &stack,
        "prepare",
        json!({"vm_id": "netvm", "image": "python", "host_path": project.path()}),
    )
    .await;
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": "netvm",
               "command": ["python3", "/worker/worker.py", "serve", "netvm::hello", "from-the-vm"]}),
    )
    .await;
    wait_log(&stack, "netvm", "registered", 1, Duration::from_secs(60)).await;
    let mut answer = Value::Null;
    for _ in 0..100 {
        match stack
            .client
            .invoke("netvm::hello", json!({}), Duration::from_secs(10))
            .await
        {
            Ok(value) => {
                answer = value;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(
        answer,
        json!({"answer": "from-the-vm"}),
        "{}",
        stack.adapter.log()
    );

    // ... and nothing else of the host's loopback; the rest of the policy as a sandbox's.
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = other.local_addr().unwrap().port();
    let private = format!("{}:{PORT}", PRIVATE[0]);
    worker_ok(
        &stack,
        "stop",
        json!({"vm_id": "netvm", "timeout_ms": 2000}),
    )
    .await;
    worker_ok(
        &stack,
        "start",
        json!({"vm_id": "netvm",
               "command": ["python3", "/worker/worker.py", "probe", PUBLIC, PORT.to_string(),
                           PRIVATE[0], PORT.to_string(), "127.0.0.1", other.to_string()]}),
    )
    .await;
    let log = wait_log(
        &stack,
        "netvm",
        &format!("127.0.0.1:{other} "),
        1,
        Duration::from_secs(60),
    )
    .await;
    let line = |target: &str| {
        log.lines()
            .find(|l| l.starts_with(&format!("{target} ")))
            .unwrap_or_else(|| panic!("no probe of {target}: {log}"))
            .to_string()
    };
    let other_port = line(&format!("127.0.0.1:{other}"));
    assert!(
        other_port.contains(" refused "),
        "another loopback port: {other_port}"
    );
    let public = line(&public());
    let private = line(&private);
    assert!(
        public.contains(" ok hello-public"),
        "the public side: {public}"
    );
    assert!(
        private.contains(" refused "),
        "a private address: {private}"
    );
}

async fn functions(stack: &Stack) -> Vec<String> {
    let list = stack
        .client
        .invoke(
            "engine::functions::list",
            json!({}),
            Duration::from_secs(10),
        )
        .await
        .expect("engine::functions::list");
    let items = list["functions"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .filter_map(|f| {
            f.as_str()
                .or_else(|| f["function_id"].as_str())
                .or_else(|| f["id"].as_str())
                .map(String::from)
        })
        .collect()
}

/// The "public" test server's second address, behind another name.
const PUBLIC_2: &str = "198.51.100.11";

/// `dns_server.py` on the host's loopback: the resolver `network_dns` points the proxy at.
struct DnsServer {
    child: Child,
    port: u16,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl DnsServer {
    fn start() -> DnsServer {
        use std::io::BufRead;
        let mut child = Command::new("python3")
            .args(["-c", DNS_SERVER])
            .args([
                format!("public.test={PUBLIC}"),
                format!("other.test={PUBLIC_2}"),
                format!("private.test={}", PRIVATE[0]),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the test DNS server");
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let port = first
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the test DNS server said {first:?}"));
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = asked.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                log.lock().unwrap().push(line);
            }
        });
        DnsServer { child, port, asked }
    }

    /// `network_dns` for this server.
    fn upstream(&self) -> Value {
        json!([format!("127.0.0.1:{}", self.port)])
    }

    /// How often it was asked for `name`.
    fn asked(&self, name: &str) -> usize {
        let wanted = format!("asked {name} ");
        let lines = self.asked.lock().unwrap();
        lines.iter().filter(|l| l.starts_with(&wanted)).count()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test helper `iii_worker.py` with `args`, in sandbox `id`: its stdout.
async fn worker(stack: &Stack, id: &str, args: &[&str]) -> String {
    let mut argv = vec!["python3".to_string(), "-c".into(), WORKER.into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let answer = exec_ok(stack, id, json!({ "argv": argv, "timeout_ms": 120_000 })).await;
    let out = stdout(&answer).trim().to_string();
    println!("{args:?}: {out}");
    out
}

/// The sandboxes' logs under `stack`'s state directory (the launcher's and the proxy's
/// words), for a failure's message.
fn sandbox_logs(stack: &Stack) -> String {
    let dir = stack.state_dir.path().join("sandboxes");
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if let Ok(text) = std::fs::read_to_string(entry.path().join("sandbox.log")) {
            out.push_str(&format!("--- {}\n{text}\n", entry.path().display()));
        }
    }
    out
}

/// The resolver proxies this test process's adapters run.
fn proxy_pids() -> Vec<String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("comm"))
                .is_ok_and(|comm| comm.trim() == "iii-dns-proxy")
        })
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|pid| of_this_test(pid))
        .collect()
}

/// pasta and the resolver proxies are counted for all of this test process's adapters: waits
/// until an earlier test's
/// sandboxes (going away as its stack drops) have taken theirs along, and fails if they stay.
async fn earlier_sandboxes_gone() {
    let clear = sandbox_support::eventually(Duration::from_secs(15), || async {
        pasta_processes() == 0 && dns_proxies() == 0
    })
    .await;
    assert!(
        clear,
        "an earlier sandbox's pasta or resolver proxy is still running: {} pasta, proxies {:?}",
        pasta_processes(),
        proxy_pids()
    );
}

fn dns_proxies() -> usize {
    proxy_pids().len()
}

#[tokio::test(flavor = "multi_thread")]
async fn dns_goes_to_our_proxy_whatever_server_is_asked_and_survives_a_flood() {
    if !netns_usable("dns_goes_to_our_proxy_whatever_server_is_asked_and_survives_a_flood") {
        return;
    }
    let _serial = SERIAL.lock().await;
    earlier_sandboxes_gone().await;
    let mut public = public_host();
    public.add_address(&format!("{PUBLIC_2}/24"), "hello-public");
    let dns = DnsServer::start();
    let stack = Stack::start(
        json!({"network_dns": dns.upstream()}),
        on_plugin_under_test(AdapterOptions::default()),
    )
    .await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let features = &info["backend"]["isolation"]["network"]["features"];
    assert_eq!(
        features,
        &json!(["network-policy", "network-names"]),
        "{info}"
    );
    let id = create(&stack, "python", json!({"network": true})).await;
    assert_eq!(
        worker(&stack, &id, &["resolve", "public.test"]).await,
        format!("public.test ok {PUBLIC}"),
        "asked {} times; proxies {}\n{}",
        dns.asked("public.test"),
        dns_proxies(),
        sandbox_logs(&stack)
    );
    let target = format!("public.test:{PORT}");
    let results = probe(&stack, &id, std::slice::from_ref(&target)).await;
    assert_eq!(verdict(&results, &target), "ok hello-public");
    assert_eq!(dns_proxies(), 1, "one resolver proxy for the one sandbox");
    // It serves from the sandbox's network namespace (its sockets to the resolvers are all it
    // kept of the host's).
    let host_netns = std::fs::read_link("/proc/self/ns/net").unwrap();
    for pid in proxy_pids() {
        let netns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
        assert_ne!(
            netns, host_netns,
            "the proxy is in the host's network namespace"
        );
    }

    // Another server asked directly, over udp and tcp: nothing listens there (and TEST-NET-3
    // routes nowhere), so an answer is our proxy's, which asked the test's server.
    for (server, proto) in [
        ("203.0.113.53", "udp"),
        ("203.0.113.53", "tcp"),
        (PUBLIC, "udp"),
    ] {
        let before = dns.asked("other.test");
        let answer = worker(&stack, &id, &["ask", server, "other.test", proto]).await;
        assert_eq!(
            answer,
            format!("ask ok {PUBLIC_2}"),
            "{server} over {proto}"
        );
        assert!(
            dns.asked("other.test") > before,
            "the proxy asked our server"
        );
    }

    // Hostile input: the proxy drops it and goes on answering.
    let flooded = worker(&stack, &id, &["flood", DNS_FORWARD, "3000"]).await;
    assert!(flooded.starts_with("flooded "), "{flooded}");
    assert_eq!(
        worker(&stack, &id, &["resolve", "other.test"]).await,
        format!("other.test ok {PUBLIC_2}")
    );
    assert_eq!(dns_proxies(), 1, "the proxy survived the flood");
    // Out of the sandbox's reach: not among its processes, and a kill of everything it can
    // signal leaves the proxy serving. (In a microVM the proxy is a host process of the
    // runner's, out of the guest's sight by construction; and a guest's `kill -9 -1` would
    // end its agent, which is not the guest's init there.)
    if !libkrun_under_test() {
        sandbox_kills_everything_and_the_proxy_serves_on(&stack, &id).await;
    }
    assert_eq!(
        worker(&stack, &id, &["resolve", "public.test"]).await,
        format!("public.test ok {PUBLIC}")
    );
    // An unknown name is the resolver's verdict, passed on.
    let unknown = worker(&stack, &id, &["resolve", "nowhere.test"]).await;
    assert!(unknown.starts_with("nowhere.test error"), "{unknown}");

    sandbox_support::stop(&stack, &id, true).await;
    let gone =
        sandbox_support::eventually(Duration::from_secs(15), || async { dns_proxies() == 0 }).await;
    assert!(gone, "the resolver proxy outlived its sandbox");
}

/// Code in sandbox `id` lists every process it sees and signals every one it can: the
/// resolver proxy is not among them and still runs.
async fn sandbox_kills_everything_and_the_proxy_serves_on(stack: &Stack, id: &str) {
    let seen = exec_ok(
        stack,
        id,
        json!({"argv": ["sh", "-c", "cat /proc/[0-9]*/comm; kill -9 -1; true"]}),
    )
    .await;
    assert!(
        stdout(&seen).contains(".iii-agent"),
        "the listing works: {seen}"
    );
    assert!(
        !stdout(&seen).contains("iii-dns-proxy"),
        "the sandbox sees the proxy: {seen}"
    );
    assert_eq!(dns_proxies(), 1, "the sandbox killed its resolver proxy");
}

/// What the sandbox's `/etc/resolv.conf` names.
const DNS_FORWARD: &str = "169.254.1.53";

#[tokio::test(flavor = "multi_thread")]
async fn a_name_in_network_deny_or_allow_judges_the_addresses_it_resolved_to() {
    if !netns_usable("a_name_in_network_deny_or_allow_judges_the_addresses_it_resolved_to") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let mut public = public_host();
    public.add_address(&format!("{PUBLIC_2}/24"), "hello-public");
    let _private = private_host();
    let dns = DnsServer::start();
    let (public_name, other_name, private_name) = (
        format!("public.test:{PORT}"),
        format!("other.test:{PORT}"),
        format!("private.test:{PORT}"),
    );

    // Denied by name: refused at once; another name (another address) still reached.
    let stack = Stack::start(
        json!({"network_dns": dns.upstream(), "network_deny": ["public.test"]}),
        on_plugin_under_test(AdapterOptions::default()),
    )
    .await;
    let id = create(&stack, "python", json!({"network": true})).await;
    let results = probe(&stack, &id, &[public_name.clone(), other_name.clone()]).await;
    assert_refused(&results, &public_name);
    assert_eq!(verdict(&results, &other_name), "ok hello-public");
    drop(stack);

    // Allowed by name: that private server by name, and nothing else, not even a private
    // address of the same server under no name.
    let stack = Stack::start(
        json!({"network_dns": dns.upstream(), "network_allow": ["private.test"]}),
        on_plugin_under_test(AdapterOptions::default()),
    )
    .await;
    let id = create(&stack, "python", json!({"network": true})).await;
    let other_private = format!("{}:{PORT}", PRIVATE[1]);
    let results = probe(
        &stack,
        &id,
        &[
            private_name.clone(),
            other_private.clone(),
            public_name.clone(),
        ],
    )
    .await;
    assert_eq!(verdict(&results, &private_name), "ok hello-private");
    assert_refused(&results, &other_private);
    assert_refused(&results, &public_name);
    drop(stack);

    // A create's names narrow: its deny takes a name away, its allow never opens a private
    // address the configuration does not.
    let stack = Stack::start(
        json!({"network_dns": dns.upstream()}),
        on_plugin_under_test(AdapterOptions::default()),
    )
    .await;
    let id = create(&stack, "python", json!({"network": {"deny": ["*.test"]}})).await;
    let results = probe(&stack, &id, std::slice::from_ref(&public_name)).await;
    assert_refused(&results, &public_name);
    let id = create(
        &stack,
        "python",
        json!({"network": {"allow": ["private.test", "other.test"]}}),
    )
    .await;
    let results = probe(
        &stack,
        &id,
        &[
            private_name.clone(),
            other_name.clone(),
            public_name.clone(),
        ],
    )
    .await;
    assert_refused(&results, &private_name);
    assert_eq!(verdict(&results, &other_name), "ok hello-public");
    assert_refused(&results, &public_name);
    let refused = stack
        .call(
            "create",
            json!({"image": "python", "network": {"allow": ["bad_name.test"]}}),
        )
        .await;
    let (code, body) = expect_err(refused, "a bad name");
    assert_eq!(code, "S001", "{body}");
    assert!(body.to_string().contains("network.allow"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_name_or_resolver_in_the_configuration_stops_the_adapter() {
    for (key, value) in [
        ("network_allow", json!(["ok.test", "under_score.test"])),
        ("network_deny", json!(["-x.test"])),
        ("network_dns", json!(["dns.test"])),
    ] {
        let state = e2e_tests::host_dir();
        let options = AdapterOptions::default();
        let config = e2e_tests::config_with(state.path(), json!({ key: value }));
        let engine = iii_test_engine::Engine::with_config(options.config_name.clone(), config)
            .start("127.0.0.1:0".parse().unwrap())
            .await
            .expect("start engine");
        let mut adapter = e2e_tests::Adapter::spawn(&engine.url(), &options);
        let status = adapter.wait_exit(Duration::from_secs(30));
        let log = adapter.log();
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{key}: {log}");
        assert!(log.contains(&format!("`{key}`")), "{key}: {log}");
    }
}
