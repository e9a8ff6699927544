//! The boundary follows the host's addresses while sandboxes run. An address the host gains
//! after a sandbox started (a DHCP or SLAAC renewal, a VPN, a cloud's secondary address; here
//! 198.51.100.7/32 on `lo` and 2001:db8::7 on a veth pair of this test's) leads to every
//! service listening on the host's wildcard address, an engine on 0.0.0.0 among them. Each
//! sandbox's gate must refuse it, the running sandbox's and a new one's alike, within a
//! measured bound, and release it once the host no longer has it.
//!
//! TEST-NET-2 is in no default-denied range: only the gate's set of the host's addresses
//! stands between a sandbox and the bait. bwrap's gate; a libkrun runner's namespace is
//! filled by the same resolver proxy code (`egress/src/host_watch.rs`), and the VM lab runs
//! these tests on microVMs (`SANDBOX_E2E_NETWORK_PLUGIN=libkrun`).
//!
//! The link between a sandbox and its gate avoids the host's own prefixes: pasta copies the
//! host's routes into the gate, and a link prefix the host also routes (this host is numbered
//! in fd00::/64, slirp4netns's IPv6 link) would send the sandbox's packets for the host's
//! neighbours back to the sandbox. Neither the gate's link routes nor the sandbox's own
//! routes may overlap one of the host's, a configured prefix is used as named, and one the
//! host routes stops the adapter.

mod sandbox_support;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::{bwrap_usable, AdapterOptions, Stack};
use sandbox_support::{create, exec_ok};
use serde_json::{json, Value};

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

/// Whether the libkrun plugin's microVMs are under test (`SANDBOX_E2E_NETWORK_PLUGIN=libkrun`,
/// as the VM lab runs the network tests): their runner's namespace holds the same policy,
/// sets and resolver proxy, with TSI in place of a gate's link.
fn libkrun_under_test() -> bool {
    std::env::var("SANDBOX_E2E_NETWORK_PLUGIN").is_ok_and(|p| p == "libkrun")
}

/// Whether `test` can run: as root (it numbers the host), with iproute2, nsenter, nft and
/// pasta, on a plugin `plugin_usable` accepts; else it says it did not run.
fn can_run(test: &str, plugin_usable: fn(&str) -> bool) -> bool {
    let tools = ["ip", "nsenter", "nft", "pasta"]
        .iter()
        .all(|tool| Command::new(tool).arg("--version").output().is_ok());
    if !nix::unistd::geteuid().is_root() || !tools {
        println!("\n*** {test} DID NOT RUN: needs root, iproute2, nsenter, nft and pasta ***\n");
        return false;
    }
    plugin_usable(test)
}

/// Whether `test` can run here: bwrap where it is usable (else it says it did not run); the
/// libkrun plugin must boot where it is the plugin under test, never skip.
fn usable(test: &str) -> bool {
    libkrun_under_test() || bwrap_usable(test)
}

/// The adapter on the plugin under test with `config` (the libkrun plugin under its own
/// adapter name), which must then report a backend that boots.
async fn stack_under_test(config: Value) -> Stack {
    let mut options = AdapterOptions::default();
    if libkrun_under_test() {
        options.plugin = e2e_tests::PluginKind::Libkrun;
        options.prefix = None;
    }
    let stack = Stack::start(config, options).await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    assert_eq!(
        info["backend"]["ready"], true,
        "a backend that boots: {info}"
    );
    stack
}

#[tokio::test(flavor = "multi_thread")]
async fn an_address_the_host_gains_is_refused_to_every_sandbox_and_released_when_gone() {
    let test = "an_address_the_host_gains_is_refused_to_every_sandbox_and_released_when_gone";
    if !can_run(test, usable) {
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

    let stack = stack_under_test(json!({})).await;
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
        // The host's other addresses are still refused (loopback's local route: its /8).
        assert!(holds(&listing, "127.0.0.0/8"), "{listing}");
    }
}

/// An AnyIP route (`ip route add local <prefix> dev lo`) makes the host answer on every
/// address of the prefix, none of which is an interface's: the gate refuses the whole prefix
/// while the route exists.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefix_the_host_answers_on_as_a_whole_is_refused_while_it_does() {
    const ANYIP: &str = "198.51.100.128/25";
    const INSIDE: &str = "198.51.100.200";
    let test = "a_prefix_the_host_answers_on_as_a_whole_is_refused_while_it_does";
    if !can_run(test, usable) {
        return;
    }
    /// The route this test gave the host, removed when dropped (a failed assertion too).
    struct Route;
    impl Drop for Route {
        fn drop(&mut self) {
            let _ = Command::new("ip")
                .args(["route", "del", "local", ANYIP, "dev", "lo"])
                .stderr(Stdio::null())
                .status();
        }
    }
    let bait = TcpListener::bind("0.0.0.0:0").expect("bait");
    bait.set_nonblocking(true).unwrap();
    let target = vec![format!("{INSIDE} {}", bait.local_addr().unwrap().port())];
    let stack = stack_under_test(json!({})).await;
    let id = create(&stack, "python", json!({"network": true})).await;
    let gate = gates(&stack);
    assert_eq!(gate.len(), 1, "one resolver proxy per sandbox");

    ip(&["route", "add", "local", ANYIP, "dev", "lo"]);
    let route = Route;
    let since = Instant::now();
    while !holds(&host_set(gate[0]), ANYIP) {
        assert!(
            since.elapsed() < BOUND,
            "the gate did not refuse {ANYIP} within {BOUND:?}:\n{}",
            host_set(gate[0])
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    println!(
        "the gate refused the AnyIP prefix after {:?}",
        since.elapsed()
    );
    let report = probe(&stack, &id, &target).await;
    assert!(
        report.contains(&format!("{} refused", target[0])),
        "the sandbox was not refused {INSIDE}:\n{report}"
    );
    let heard = accepted(&[&bait]);
    assert!(heard.is_empty(), "a sandbox reached the host: {heard:?}");

    drop(route);
    let since = Instant::now();
    while holds(&host_set(gate[0]), ANYIP) {
        assert!(
            since.elapsed() < BOUND,
            "the gate still refused {ANYIP} after {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    println!(
        "the gate released the AnyIP prefix after {:?}",
        since.elapsed()
    );
}

/// A route's destination: the address's bits (an IPv4 one in the top 32) and prefix length.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Prefix {
    v6: bool,
    bits: u128,
    len: u8,
}

impl Prefix {
    /// `address/len` or a bare address.
    fn parse(text: &str) -> Option<Prefix> {
        let (address, len) = text.split_once('/').unwrap_or((text, ""));
        let (v6, bits, max) = match address.parse::<std::net::IpAddr>().ok()? {
            std::net::IpAddr::V4(v4) => (false, u128::from(u32::from(v4)) << 96, 32),
            std::net::IpAddr::V6(v6) => (true, u128::from(v6), 128),
        };
        let len = if len.is_empty() {
            max
        } else {
            len.parse().ok()?
        };
        (len <= max).then_some(Prefix {
            v6,
            bits: bits & mask(len),
            len,
        })
    }

    fn overlaps(&self, other: &Prefix) -> bool {
        let len = self.len.min(other.len);
        self.v6 == other.v6 && self.bits & mask(len) == other.bits & mask(len)
    }

    /// What no link is meant to avoid: default routes, loopback, link-local (every link has
    /// its own fe80::/64) and multicast.
    fn ordinary(&self) -> bool {
        let special = if self.v6 {
            ["::1/128", "fe80::/10", "ff00::/8"]
        } else {
            ["127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4"]
        };
        self.len > 0
            && !special
                .iter()
                .filter_map(|s| Prefix::parse(s))
                .any(|s| s.overlaps(self))
    }
}

/// As `ip` writes it.
impl std::fmt::Debug for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.v6 {
            write!(f, "{}/{}", std::net::Ipv6Addr::from(self.bits), self.len)
        } else {
            let network = u32::try_from(self.bits >> 96).unwrap_or_default();
            write!(f, "{}/{}", std::net::Ipv4Addr::from(network), self.len)
        }
    }
}

fn mask(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// `(device, destination)` of every route `ip -o route show <args>` lists, both families,
/// in the network namespace `netns` names (`nsenter`'s `--net=` argument) or the host's (a
/// type word such as `local` or `unreachable` before the destination skipped).
fn ip_routes(netns: Option<&str>, args: &[&str]) -> Vec<(String, Prefix)> {
    let mut routes = Vec::new();
    for family in ["-4", "-6"] {
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("nsenter");
                command.args([netns, "ip"]);
                command
            }
            None => Command::new("ip"),
        };
        let out = command
            .args(["-o", family, "route", "show"])
            .args(args)
            .output()
            .expect("ip route");
        assert!(out.status.success(), "{out:?}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let kinds = [
                "local",
                "broadcast",
                "unreachable",
                "multicast",
                "anycast",
                "blackhole",
                "prohibit",
                "throw",
                "nat",
            ];
            let at = usize::from(words.first().is_some_and(|w| kinds.contains(w)));
            let destination = match words.get(at) {
                Some(&"default") => Some(Prefix {
                    v6: family == "-6",
                    bits: 0,
                    len: 0,
                }),
                Some(word) => Prefix::parse(word),
                None => None,
            };
            let device = words
                .iter()
                .position(|w| *w == "dev")
                .and_then(|i| words.get(i + 1))
                .unwrap_or(&"");
            if let Some(destination) = destination {
                routes.push((device.to_string(), destination));
            }
        }
    }
    routes
}

/// Prints `route <device> <destination>` for every route the sandbox's kernel holds (every
/// table), then `addr4 <address>` (the source it would use) and `addr6 <device> <address>`.
const ROUTES: &str = r#"
import socket, struct
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    dest = socket.inet_ntoa(struct.pack("=I", int(f[1], 16)))
    print("route", f[0], "%s/%d" % (dest, bin(int(f[7], 16)).count("1")))
try:
    lines = open("/proc/net/ipv6_route").read().splitlines()
    addresses = open("/proc/net/if_inet6").read().splitlines()
except OSError:
    lines, addresses = [], []
for line in lines:
    f = line.split()
    dest = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(f[0]))
    print("route", f[-1], "%s/%d" % (dest, int(f[1], 16)))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("198.51.100.1", 9))
print("addr4", s.getsockname()[0])
for line in addresses:
    f = line.split()
    print("addr6", f[-1], socket.inet_ntop(socket.AF_INET6, bytes.fromhex(f[0])))
"#;

/// What sandbox `id` sees of its routes and its own addresses.
async fn sandbox_view(stack: &Stack, id: &str) -> (Vec<(String, Prefix)>, Vec<String>) {
    let out = exec_ok(
        stack,
        id,
        json!({"argv": ["python3", "-c", ROUTES], "timeout_ms": 60_000}),
    )
    .await;
    let stdout = out["stdout"].as_str().unwrap_or_default();
    println!(
        "{id} sees:\n{stdout}{}",
        out["stderr"].as_str().unwrap_or_default()
    );
    let mut routes = Vec::new();
    let mut addresses = Vec::new();
    for line in stdout.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["route", device, destination] => {
                routes.push((device.to_string(), Prefix::parse(destination).unwrap()));
            }
            ["addr4", address] | ["addr6", "eth0", address] => addresses.push(address.to_string()),
            _ => {}
        }
    }
    (routes, addresses)
}

/// Whether the sandbox has an IPv6 default route on its link.
fn routed_v6(routes: &[(String, Prefix)]) -> bool {
    routes
        .iter()
        .any(|(device, route)| device == "eth0" && route.v6 && route.len == 0)
}

/// `adapter::info`'s account of the link a sandbox created now gets.
async fn info_link(stack: &Stack) -> Value {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let link = info["backend"]["isolation"]["network"]["link"].clone();
    assert!(link["v4"].is_string() && link["v6"].is_string(), "{info}");
    link
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxs_link_overlaps_no_route_of_the_host() {
    let test = "a_sandboxs_link_overlaps_no_route_of_the_host";
    if !can_run(test, usable) {
        return;
    }
    let host: Vec<Prefix> = ip_routes(None, &["table", "all"])
        .into_iter()
        .map(|(_, destination)| destination)
        .filter(Prefix::ordinary)
        .collect();
    println!("the host's routes and addresses: {host:?}");
    if libkrun_under_test() {
        return no_link_of_ours_on_libkrun(&host).await;
    }
    let slirp_v6 = Prefix::parse("fd00::/64").unwrap();
    let host_in_fd00 = host.iter().any(|h| h.overlaps(&slirp_v6));

    let stack = Stack::bwrap().await;
    let link = info_link(&stack).await;
    println!("adapter::info says: {link}");
    let (link_v4, link_v6) = (
        Prefix::parse(link["v4"].as_str().unwrap()).unwrap(),
        Prefix::parse(link["v6"].as_str().unwrap()).unwrap(),
    );
    for chosen in [link_v4, link_v6] {
        let used: Vec<&Prefix> = host.iter().filter(|h| h.overlaps(&chosen)).collect();
        assert!(used.is_empty(), "{chosen:?} overlaps the host's {used:?}");
    }
    if host_in_fd00 {
        assert_ne!(link_v6, slirp_v6, "this host routes fd00::/64 itself");
    }

    let id = create(&stack, "python", json!({"network": true})).await;
    let gate = gates(&stack);
    assert_eq!(gate.len(), 1, "one resolver proxy per sandbox");
    let netns = format!("--net=/proc/{}/ns/net", gate[0]);
    let in_gate: Vec<(String, Prefix)> = ip_routes(Some(&netns), &[])
        .into_iter()
        .filter(|(_, destination)| destination.ordinary())
        .collect();
    println!("the gate's routes: {in_gate:?}");
    // The link's own routes are the chosen prefixes, and none is also a host's route.
    let link_routes: Vec<Prefix> = in_gate
        .iter()
        .filter(|(device, _)| device == "iii-gate")
        .map(|(_, destination)| *destination)
        .collect();
    assert!(link_routes.contains(&link_v4), "{in_gate:?}");
    assert!(
        link_routes.iter().all(|r| *r == link_v4 || *r == link_v6),
        "{in_gate:?}"
    );
    for route in &link_routes {
        assert!(
            !host.iter().any(|h| h.overlaps(route)),
            "the gate's link route {route:?} overlaps a host route: {host:?}"
        );
    }
    // No destination the gate routes two ways (the link's way and pasta's).
    for (i, (device, route)) in in_gate.iter().enumerate() {
        for (other_device, other) in &in_gate[i + 1..] {
            assert!(
                device == other_device || !route.overlaps(other),
                "the gate routes {route:?} on {device} and {other:?} on {other_device}"
            );
        }
    }

    // From inside: every route the sandbox's kernel holds (any table) but its default and
    // the special ranges is its link's, and none overlaps a route or address of the host.
    let (routes, addresses) = sandbox_view(&stack, &id).await;
    let ordinary: Vec<&(String, Prefix)> = routes.iter().filter(|(_, r)| r.ordinary()).collect();
    assert!(!ordinary.is_empty(), "{routes:?}");
    for (device, route) in &ordinary {
        assert!(
            link_v4.overlaps(route) || link_v6.overlaps(route),
            "the sandbox routes {route:?} on {device} outside its link"
        );
        let used: Vec<&Prefix> = host.iter().filter(|h| h.overlaps(route)).collect();
        assert!(
            used.is_empty(),
            "the sandbox's route {route:?} overlaps the host's {used:?}"
        );
    }
    assert_eq!(
        addresses.first(),
        link["sandbox"][0].as_str().map(String::from).as_ref()
    );
    // Its starter gives it IPv6 only where pasta got a default route from the host.
    if routed_v6(&routes) {
        let v6 = link["sandbox"][1].as_str().unwrap().to_string();
        assert!(addresses.contains(&v6), "{addresses:?}");
    }
}

/// On libkrun there is no gate and so no link of ours: TSI makes the guest's sockets the
/// runner's, in a namespace whose only routes are pasta's copies of the host's own (the
/// guest's `dummy0` shows the same copies). Nothing there can send a packet for one of the
/// host's neighbours back to the sandbox.
async fn no_link_of_ours_on_libkrun(host: &[Prefix]) {
    let stack = stack_under_test(json!({})).await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let network = &info["backend"]["isolation"]["network"];
    assert!(network["link"].is_null(), "no link on libkrun: {network}");
    let id = create(&stack, "python", json!({"network": true})).await;
    let proxy = gates(&stack);
    assert_eq!(proxy.len(), 1, "one resolver proxy per sandbox");
    let netns = format!("--net=/proc/{}/ns/net", proxy[0]);
    let in_runner: Vec<(String, Prefix)> = ip_routes(Some(&netns), &[])
        .into_iter()
        .filter(|(_, destination)| destination.ordinary())
        .collect();
    println!("the runner's namespace routes: {in_runner:?}");
    for (device, route) in &in_runner {
        assert!(
            host.contains(route),
            "the runner's namespace routes {route:?} on {device}, which the host does not: {host:?}"
        );
    }
    // The guest's own routes, too, are the host's: every socket it makes is the runner's.
    let (routes, _) = sandbox_view(&stack, &id).await;
    for (device, route) in routes.iter().filter(|(_, r)| r.ordinary()) {
        assert!(
            host.contains(route),
            "the guest routes {route:?} on {device}, which the host does not: {host:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configured_link_is_used_and_one_the_host_routes_stops_the_adapter() {
    let test = "a_configured_link_is_used_and_one_the_host_routes_stops_the_adapter";
    let tools = ["ip", "pasta", "nft"]
        .iter()
        .all(|tool| Command::new(tool).arg("-V").output().is_ok());
    if !nix::unistd::geteuid().is_root() || !tools {
        println!("\n*** {test} DID NOT RUN: needs root, iproute2, nft and pasta ***\n");
        return;
    }
    if !usable(test) {
        return;
    }
    let host: Vec<Prefix> = ip_routes(None, &["table", "all"])
        .into_iter()
        .map(|(_, destination)| destination)
        .filter(Prefix::ordinary)
        .collect();
    let (v4, v6) = ("10.213.47.0/24", "fd5a:1b2c:3d4e::/64");
    if host.iter().any(|h| {
        [v4, v6]
            .iter()
            .any(|c| h.overlaps(&Prefix::parse(c).unwrap()))
    }) {
        println!("\n*** {test} DID NOT RUN: this host routes {v4} or {v6} ***\n");
        return;
    }
    let stack = stack_under_test(json!({"network_link_v4": v4, "network_link_v6": v6})).await;
    let id = create(&stack, "python", json!({"network": true})).await;
    let (routes, addresses) = sandbox_view(&stack, &id).await;
    if libkrun_under_test() {
        // No gate, so no link to configure: a microVM's guest holds none of its prefixes.
        let info = stack.call("adapter::info", json!({})).await.expect("info");
        let network = &info["backend"]["isolation"]["network"];
        assert!(network["link"].is_null(), "{network}");
        let configured = [Prefix::parse(v4).unwrap(), Prefix::parse(v6).unwrap()];
        for (device, route) in routes.iter().filter(|(_, r)| r.ordinary()) {
            assert!(
                !configured.iter().any(|c| c.overlaps(route)),
                "the guest routes {route:?} on {device}"
            );
        }
        assert!(
            !addresses.iter().any(|a| a.starts_with("10.213.47.")),
            "{addresses:?}"
        );
    } else {
        let link = info_link(&stack).await;
        assert_eq!(link["v4"], v4, "{link}");
        assert_eq!(link["v6"], v6, "{link}");
        assert_eq!(addresses.first().map(String::as_str), Some("10.213.47.100"));
    }
    if !libkrun_under_test() && routed_v6(&routes) {
        assert!(
            addresses.iter().any(|a| a == "fd5a:1b2c:3d4e::100"),
            "{addresses:?}"
        );
    }
    drop(stack);

    // A prefix of one of the host's own routes: the adapter refuses to start.
    let Some(used) = ip_routes(None, &[])
        .into_iter()
        .map(|(_, destination)| destination)
        .find(|r| !r.v6 && r.ordinary() && r.len <= 24)
    else {
        println!("{test}: no IPv4 route of /24 or wider here: the refusal not run");
        return;
    };
    // Its first /24, written as `ip` writes the route.
    let inside = format!("{:?}", Prefix { len: 24, ..used });
    let state = e2e_tests::host_dir();
    let mut options = AdapterOptions::default();
    if libkrun_under_test() {
        options.plugin = e2e_tests::PluginKind::Libkrun;
        options.prefix = None;
    }
    let config = e2e_tests::config_with(state.path(), json!({ "network_link_v4": inside }));
    let engine = iii_test_engine::Engine::with_config(options.config_name.clone(), config)
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("start engine");
    let mut adapter = e2e_tests::Adapter::spawn(&engine.url(), &options);
    let status = adapter.wait_exit(Duration::from_secs(30));
    let log = adapter.log();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{inside}: {log}");
    assert!(
        log.contains("`network_link_v4`") && log.contains("overlaps"),
        "{log}"
    );
}

/// A route of a policy-routing table is as much the host's as one of its main table: the link
/// a create picks avoids it (`/proc/net/route` lists the main table only).
#[tokio::test(flavor = "multi_thread")]
async fn a_link_avoids_a_route_of_a_policy_routing_table() {
    const TABLE: &str = "4242";
    let test = "a_link_avoids_a_route_of_a_policy_routing_table";
    if !can_run(test, bwrap_usable) {
        return;
    }
    /// The route this test gave the host, removed when dropped (a failed assertion too).
    struct Route(String);
    impl Drop for Route {
        fn drop(&mut self) {
            let _ = Command::new("ip")
                .args(["route", "del", &self.0, "dev", "lo", "table", TABLE])
                .stderr(Stdio::null())
                .status();
        }
    }
    let stack = Stack::bwrap().await;
    let before = info_link(&stack).await["v4"].as_str().unwrap().to_string();
    ip(&["route", "add", &before, "dev", "lo", "table", TABLE]);
    let _route = Route(before.clone());
    let after = info_link(&stack).await["v4"].as_str().unwrap().to_string();
    println!("link v4 {before}, then with it in table {TABLE}: {after}");
    let taken = Prefix::parse(&before).unwrap();
    let chosen = Prefix::parse(&after).unwrap();
    assert!(!chosen.overlaps(&taken), "{after} overlaps {before}");

    create(&stack, "python", json!({"network": true})).await;
    let gate = gates(&stack);
    assert_eq!(gate.len(), 1, "one resolver proxy per sandbox");
    let netns = format!("--net=/proc/{}/ns/net", gate[0]);
    let link_routes: Vec<Prefix> = ip_routes(Some(&netns), &[])
        .into_iter()
        .filter(|(device, _)| device == "iii-gate")
        .map(|(_, destination)| destination)
        .collect();
    assert!(link_routes.contains(&chosen), "{link_routes:?}");
    assert!(
        !link_routes.iter().any(|r| r.overlaps(&taken)),
        "{link_routes:?}"
    );
}
