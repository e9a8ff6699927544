//! A network namespace of the test's own, joined to the host by a veth pair: a host "out
//! there" at addresses the test picks, for the egress tests. Removed when dropped, after the
//! program the test serves in it (kept by the caller, dropped first).

use std::process::{Command, Stdio};
use std::time::Duration;

pub struct VethHost {
    /// The namespace's name; its veth ends are `<ns>h` (host) and `<ns>n` (inside).
    pub ns: String,
    pub ns_if: String,
    host_if: String,
}

impl VethHost {
    /// A namespace `ns` (at most 13 characters: interface names are 15 at most) with each of
    /// `pairs` (host side, namespace side, both with their prefix length) on the veth, both
    /// ends and the namespace's loopback up. A namespace of that name a killed run left is
    /// removed first.
    pub fn new(ns: String, pairs: &[(&str, &str)]) -> VethHost {
        remove_leftovers();
        let (host_if, ns_if) = (format!("{ns}h"), format!("{ns}n"));
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        ip(&["netns", "add", &ns]);
        let host = VethHost { ns, ns_if, host_if };
        ip(&[
            "link",
            "add",
            &host.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &host.ns_if,
        ]);
        let me = std::process::id();
        let owner = format!(
            "{OWNER_ALIAS} ns={} pid={me} start={}",
            host.ns,
            start_time(me).unwrap_or_default()
        );
        ip(&["link", "set", "dev", &host.host_if, "alias", &owner]);
        ip(&["link", "set", &host.ns_if, "netns", &host.ns]);
        for (outside, inside) in pairs {
            ip(&["addr", "add", outside, "dev", &host.host_if]);
            host.inside(&["addr", "add", inside, "dev", &host.ns_if]);
        }
        ip(&["link", "set", &host.host_if, "up"]);
        host.inside(&["link", "set", &host.ns_if, "up"]);
        host.inside(&["link", "set", "lo", "up"]);
        for (_, inside) in pairs {
            host.route_here(inside.split('/').next().unwrap_or(inside));
        }
        host
    }

    /// Makes the host's route to `address` this veth and checks it. The host is shared: a
    /// namespace a killed run left, or another job's, may hold the same prefix (its route
    /// then comes first and our frames go to it). A route to the one address is more
    /// specific than any prefix, and `replace` takes it over from a leftover of the same.
    pub fn route_here(&self, address: &str) {
        let (family, host_prefix) = if address.contains(':') {
            ("-6", "128")
        } else {
            ("-4", "32")
        };
        let route = format!("{address}/{host_prefix}");
        ip(&[family, "route", "replace", &route, "dev", &self.host_if]);
        let out = Command::new("ip")
            .args([family, "route", "get", address])
            .output()
            .expect("run ip route get");
        let chosen = String::from_utf8_lossy(&out.stdout).into_owned();
        let through_us = chosen
            .split_whitespace()
            .skip_while(|word| *word != "dev")
            .nth(1)
            == Some(self.host_if.as_str());
        assert!(
            through_us,
            "the host routes {address} elsewhere than this test's veth {}: {chosen}",
            self.host_if
        );
    }

    /// `ip -n <ns> ARGS`, which must succeed.
    pub fn inside(&self, args: &[&str]) {
        let mut all = vec!["-n", &self.ns];
        all.extend_from_slice(args);
        ip(&all);
    }

    /// A command run in the namespace (`ip netns exec <ns> PROGRAM`).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns, program]);
        command
    }
}

/// What the host end of each test veth is called by (its `ifalias`), with the namespace it
/// leads to and the test process that made it: a later run removes what a killed run left,
/// and nothing of another job's.
const OWNER_ALIAS: &str = "sandbox-libkrun-test";

/// Removes the namespaces (and with them their veths) of test processes that are gone: a
/// test killed mid-run leaves its namespace, whose routes then stay on the host.
fn remove_leftovers() {
    let Ok(out) = Command::new("ip").args(["-j", "link", "show"]).output() else {
        return;
    };
    let links: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    for link in links {
        let Some(rest) = link["ifalias"]
            .as_str()
            .and_then(|alias| alias.strip_prefix(OWNER_ALIAS))
        else {
            continue;
        };
        let field = |name: &str| {
            rest.split_whitespace()
                .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        let (Some(ns), Some(pid), Some(start)) = (field("ns"), field("pid"), field("start")) else {
            continue;
        };
        let owner_alive = pid
            .parse()
            .ok()
            .and_then(start_time)
            .is_some_and(|now| now.to_string() == start);
        if !owner_alive {
            println!("removing the test namespace {ns}, left by a test process that is gone");
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
            if let Some(name) = link["ifname"].as_str() {
                let _ = Command::new("ip")
                    .args(["link", "del", name])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// When process `pid` started (clock ticks after boot, `/proc/PID/stat`'s 22nd field): with
/// the pid, which process it is, whatever reused the number since.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {args:?}");
}

impl Drop for VethHost {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        // The kernel takes the namespace's veth down after `ip netns del` returns: the next
        // test's link of the same name and address waits for it.
        for _ in 0..100 {
            let gone = Command::new("ip")
                .args(["link", "show", &self.host_if])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| !s.success());
            if gone {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
