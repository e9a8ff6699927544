//! Raw `/proc` observations as a table's fields, in symbols that hold on any host: ids
//! relative to the adapter and its sandboxes' range, namespaces named after the first
//! process (in table order) that holds them, files by role, never this machine's paths.

use std::collections::BTreeMap;

use super::caps;
use super::procfs::{RawFd, RawProcess, Socket, NS_KINDS};
use super::table::{Process, Table, Value};

/// One process found, with its role and its parent's role (`adapter` for the adapter's
/// children).
#[derive(Debug, Clone)]
pub struct Observation {
    pub role: String,
    pub parent: String,
    pub raw: RawProcess,
}

/// What symbols stand for on this run.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Host path prefixes and their symbols (`{state}`, `{cache}`, ...).
    pub paths: Vec<(String, String)>,
    /// Names of this run (sandbox ids, a worker's id) and their symbols.
    pub names: Vec<(String, String)>,
    /// The engine's port on the host's loopback.
    pub engine_port: u16,
    /// A sandbox's `RLIMIT_NOFILE` as `soft:hard`, which the adapter sizes from this host's
    /// `fs.file-max` and its sandbox cap (`adapter::info`'s `backend.isolation.ceilings`): shown as
    /// `{sandbox}`.
    pub sandbox_nofile: Option<String>,
    /// The addresses of a sandbox's gate on its link (`adapter::info`'s
    /// `backend.isolation.network.link.gate`) and their symbols, `{gate_v4}` and `{gate_v6}`:
    /// the link's prefixes are the first this host leaves free, so they vary by host.
    pub gate: Vec<(String, String)>,
}

/// The whole observation of one adapter: itself, every process it started, and the test
/// process that started it (whose descriptors the adapter may have inherited).
pub struct Observed {
    pub adapter: RawProcess,
    pub procs: Vec<Observation>,
    pub starter: RawProcess,
}

/// Symbols of host ids: `root`, `adapter` (its own uid or gid), `sub+N` (the range its
/// sandboxes' other ids come from: the lowest outside id of every user namespace seen that
/// is neither), else `host:N`.
struct Ids {
    adapter_uid: u32,
    adapter_gid: u32,
    sub_uid: Option<u64>,
    sub_gid: Option<u64>,
    group_names: BTreeMap<u32, String>,
}

impl Ids {
    fn new(observed: &Observed) -> Ids {
        let adapter_uid = observed.adapter.ids("Uid")[1];
        let adapter_gid = observed.adapter.ids("Gid")[1];
        let lowest = |maps: &dyn Fn(&RawProcess) -> &Vec<[u64; 3]>, own: u32| {
            observed
                .procs
                .iter()
                .flat_map(|o| maps(&o.raw).iter())
                .map(|line| line[1])
                .filter(|outside| *outside != 0 && *outside != u64::from(own))
                .min()
        };
        let group_names = std::fs::read_to_string("/etc/group")
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let mut f = line.split(':');
                let name = f.next()?;
                let gid = f.nth(1)?.parse().ok()?;
                Some((gid, name.to_string()))
            })
            .collect();
        Ids {
            adapter_uid,
            adapter_gid,
            sub_uid: lowest(&|p| &p.uid_map, adapter_uid),
            sub_gid: lowest(&|p| &p.gid_map, adapter_gid),
            group_names,
        }
    }

    fn symbol(id: u64, own: u32, sub: Option<u64>) -> String {
        match (id, sub) {
            (0, _) => "root".into(),
            (id, _) if id == u64::from(own) => "adapter".into(),
            (id, Some(sub)) if id == sub => "sub".into(),
            (id, Some(sub)) if id > sub && id - sub < 1 << 20 => format!("sub+{}", id - sub),
            (id, _) => format!("host:{id}"),
        }
    }

    fn uid(&self, id: u64) -> String {
        Self::symbol(id, self.adapter_uid, self.sub_uid)
    }

    fn gid(&self, id: u64) -> String {
        let symbol = Self::symbol(id, self.adapter_gid, self.sub_gid);
        match (symbol.starts_with("host:"), u32::try_from(id)) {
            (true, Ok(gid)) => self
                .group_names
                .get(&gid)
                .map_or(symbol, |name| format!("group:{name}")),
            _ => symbol,
        }
    }
}

/// Namespaces by (kind, inode): `adapter` if the adapter's, else the role of the first
/// process in table order that holds it; a user namespace nobody holds (a parent made and
/// left by a starter) is `unheld-N`.
struct Namespaces {
    names: BTreeMap<(String, u64), String>,
    unheld: std::cell::RefCell<Vec<u64>>,
}

impl Namespaces {
    fn new(observed: &Observed) -> Namespaces {
        let mut names = BTreeMap::new();
        for (kind, inode) in &observed.adapter.ns {
            names.insert((kind.clone(), *inode), "adapter".to_string());
        }
        // The name a namespace goes by is its most telling holder's: the agent's for the
        // sandbox's own, pasta's for the one it serves (the gate), else the first in table
        // order.
        let rank = |role: &str| match role.rsplit_once('.').map_or(role, |(_, name)| name) {
            "agent" => 0,
            "pasta" => 1,
            _ => 2,
        };
        let mut ranked: Vec<&Observation> = observed.procs.iter().collect();
        ranked.sort_by_key(|o| rank(&o.role));
        for o in ranked {
            for (kind, inode) in &o.raw.ns {
                names
                    .entry((kind.clone(), *inode))
                    .or_insert_with(|| o.role.clone());
            }
        }
        Namespaces {
            names,
            unheld: Default::default(),
        }
    }

    fn name(&self, kind: &str, inode: u64) -> String {
        if let Some(name) = self.names.get(&(kind.to_string(), inode)) {
            return name.clone();
        }
        let mut unheld = self.unheld.borrow_mut();
        let n = match unheld.iter().position(|i| *i == inode) {
            Some(n) => n,
            None => {
                unheld.push(inode);
                unheld.len() - 1
            }
        };
        format!("unheld-{kind}-{}", n + 1)
    }
}

/// The table of everything observed (without `parent_death`, measured later by killing).
pub fn describe(observed: &Observed, context: &Context) -> Table {
    let ids = Ids::new(observed);
    let namespaces = Namespaces::new(observed);
    let full = caps::full_mask();
    let mut table = Table::default();
    for o in &observed.procs {
        let raw = &o.raw;
        let mut p = Process::new(&o.role);
        p.set("parent", Value::text(&o.parent));
        p.set("program", Value::text(program(&raw.exe)));
        let show_ids = |key: &str, symbol: &dyn Fn(u64) -> String| {
            raw.ids(key)
                .iter()
                .map(|id| symbol(u64::from(*id)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        p.set("uids", Value::Text(show_ids("Uid", &|id| ids.uid(id))));
        p.set("gids", Value::Text(show_ids("Gid", &|id| ids.gid(id))));
        // The adapter's own supplementary groups (whatever its host gave its user, such as
        // `kvm`) as one symbol; any other list by name.
        let groups_of = |p: &RawProcess| p.status.get("Groups").cloned().unwrap_or_default();
        let groups = match groups_of(raw) {
            own if !own.is_empty() && own == groups_of(&observed.adapter) => {
                vec!["(the adapter's)".to_string()]
            }
            own => own
                .split_whitespace()
                .filter_map(|g| g.parse::<u64>().ok())
                .map(|g| ids.gid(g))
                .collect(),
        };
        p.set("groups", Value::List(groups));
        let userns = raw.ns.get("user").copied().unwrap_or(0);
        let own_userns = observed.adapter.ns.get("user") == Some(&userns);
        p.set("userns", Value::Text(namespaces.name("user", userns)));
        p.set(
            "userns_parent",
            Value::Text(match (own_userns, raw.userns_parent) {
                (true, _) => "(the adapter's)".into(),
                (false, Some(parent)) => namespaces.name("user", parent),
                (false, None) => "(none visible)".into(),
            }),
        );
        p.set(
            "userns_owner",
            Value::Text(match (own_userns, raw.userns_owner) {
                (true, _) => "(the adapter's)".into(),
                (false, Some(owner)) => ids.uid(u64::from(owner)),
                (false, None) => "(unreadable)".into(),
            }),
        );
        let map = |lines: &[[u64; 3]], symbol: &dyn Fn(u64) -> String| {
            if own_userns {
                return vec!["(the adapter's)".to_string()];
            }
            lines
                .iter()
                .map(|[inside, outside, count]| format!("{inside} {} {count}", symbol(*outside)))
                .collect()
        };
        p.set("uid_map", Value::List(map(&raw.uid_map, &|id| ids.uid(id))));
        p.set("gid_map", Value::List(map(&raw.gid_map, &|id| ids.gid(id))));
        for (field, key) in [
            ("cap_eff", "CapEff"),
            ("cap_prm", "CapPrm"),
            ("cap_inh", "CapInh"),
            ("cap_bnd", "CapBnd"),
            ("cap_amb", "CapAmb"),
        ] {
            // In the adapter's own namespace a set as large as the adapter's is its own
            // (whatever the host gave the adapter); otherwise named.
            let mask = raw.cap(key);
            let value = if own_userns && mask != 0 && mask == observed.adapter.cap(key) {
                vec!["(the adapter's)".to_string()]
            } else {
                caps::describe(mask, full)
            };
            p.set(field, Value::List(value));
        }
        p.set("seccomp", Value::Text(seccomp(&raw.status)));
        p.set(
            "no_new_privs",
            Value::text(match raw.status.get("NoNewPrivs").map(String::as_str) {
                Some("1") => "yes",
                Some("0") => "no",
                _ => "(unreadable)",
            }),
        );
        let ns = NS_KINDS
            .iter()
            .filter_map(|kind| {
                let inode = raw.ns.get(*kind)?;
                (observed.adapter.ns.get(*kind) != Some(inode))
                    .then(|| format!("{kind} {}", namespaces.name(kind, *inode)))
            })
            .collect();
        p.set("ns", Value::List(ns));
        p.set("root", Value::Text(path(&raw.root, context, None)));
        p.set(
            "cwd",
            Value::Text(match raw.cwd == observed.adapter.cwd {
                true => "(the adapter's)".into(),
                false => path(&raw.cwd, context, raw.cwd_target),
            }),
        );
        p.set("fds", Value::List(fds(o, observed, &namespaces, context)));
        let rlimits = raw
            .limits
            .iter()
            .filter(|(name, value)| observed.adapter.limits.get(*name) != Some(value))
            .map(|(name, value)| match &context.sandbox_nofile {
                Some(sandbox) if name.as_str() == "nofile" && value == sandbox => {
                    format!("{name} {{sandbox}}")
                }
                _ => format!("{name} {value}"),
            })
            .collect();
        p.set("rlimits", Value::List(rlimits));
        p.set("dumpable", Value::Text(super::dumpable::judge(raw)));
        p.set("threads", Value::List(threads(raw)));
        table.processes.push(p);
    }
    table
}

/// The program's file name, without pasta's CPU-specific suffix (`passt.avx2` on a CPU
/// with AVX2, `passt` on one without).
fn program(exe: &str) -> String {
    let name = exe.rsplit('/').next().unwrap_or(exe);
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    name.strip_suffix(".avx2").unwrap_or(name).to_string()
}

fn seccomp(status: &BTreeMap<String, String>) -> String {
    match status.get("Seccomp").map(String::as_str) {
        Some("0") => "off".into(),
        Some("1") => "strict".into(),
        Some("2") => format!(
            "filter x{}",
            status.get("Seccomp_filters").map_or("?", String::as_str)
        ),
        other => format!("(unreadable: {other:?})"),
    }
}

/// Threads whose credentials, capabilities, seccomp, no_new_privs or namespaces differ from
/// the main thread's: `<comm>: <what differs>`, once per name.
fn threads(raw: &RawProcess) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for thread in &raw.threads {
        let mut differs: Vec<&str> = thread
            .status
            .iter()
            .filter(|(key, value)| *key != "State" && raw.status.get(*key) != Some(value))
            .map(|(key, _)| key.as_str())
            .collect();
        differs.extend(
            thread
                .ns
                .iter()
                .filter(|(kind, inode)| raw.ns.get(*kind) != Some(inode))
                .map(|(kind, _)| kind.as_str()),
        );
        if differs.is_empty() {
            continue;
        }
        let line = format!("{}: {}", thread.comm, differs.join(" "));
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

fn access(flags: u32) -> &'static str {
    const O_PATH: u32 = 0o10000000;
    if flags & O_PATH != 0 {
        return "path";
    }
    match flags & 0o3 {
        0 => "r",
        1 => "w",
        _ => "rw",
    }
}

fn file_kind(mode: u32) -> &'static str {
    match mode {
        0o040000 => "dir",
        0o020000 => "chr",
        0o060000 => "blk",
        0o010000 => "fifo",
        0o140000 => "sock",
        0o120000 => "link",
        0o100000 => "file",
        // A file of a FUSE mount made in a sandbox's namespace: the host's root may not
        // stat it.
        _ => "(unreachable)",
    }
}

/// The descriptors: 0, 1 and 2 by number (`0 r pipe with adapter`); the others, whose
/// numbers say nothing, counted by what they are (`x4 rw socket udp4 {host}:* net=adapter`),
/// in the order they first appear; pipes a process keeps both ends of as `x*` (pasta's
/// splice pool grows with its timers, 35 or 42 pairs a second after start).
fn fds(
    owner: &Observation,
    observed: &Observed,
    namespaces: &Namespaces,
    context: &Context,
) -> Vec<String> {
    let mut stdio = Vec::new();
    let mut others: Vec<(String, usize)> = Vec::new();
    let runner = owner.raw.exe.ends_with("/sandbox-libkrun-vm");
    for fd in &owner.raw.fds {
        let mut what = describe_fd(fd, owner, observed, namespaces, context);
        if runner && fd.num > 2 && is_guest_file(&what) {
            what = GUEST_FILES.to_string();
        }
        if fd.num <= 2 {
            stdio.push(format!("{} {what}", fd.num));
            continue;
        }
        match others.iter_mut().find(|(w, _)| *w == what) {
            Some((_, count)) => *count += 1,
            None => others.push((what, 1)),
        }
    }
    // Where the guest's first lookup falls among the runner's own descriptors is the guest's
    // timing: its files are listed last.
    if let Some(at) = others.iter().position(|(what, _)| what == GUEST_FILES) {
        let guest = others.remove(at);
        others.push(guest);
    }
    stdio.extend(others.into_iter().map(|(what, n)| {
        match what.ends_with(OWN_PIPES) || what == GUEST_FILES {
            true => format!("x* {what}"),
            false => format!("x{n} {what}"),
        }
    }));
    stdio
}

/// A VM runner's descriptors of the files and directories its guest looked up or opened
/// through virtio-fs (libkrun keeps one per inode the guest's kernel holds): counted as `x*`,
/// how many being the guest's business. The runner's own `/proc/self/fd` is not one.
const GUEST_FILES: &str = "files of its shares the guest holds (virtio-fs)";

fn is_guest_file(what: &str) -> bool {
    let file_or_dir = [
        "path dir ",
        "path file ",
        "path link ",
        "r file ",
        "rw file ",
        "r dir ",
        "rw dir ",
    ]
    .iter()
    .any(|prefix| what.starts_with(prefix));
    file_or_dir && !what.ends_with("/proc/self/fd") && !what.contains("/dev/kvm")
}

/// A pipe whose two ends only its process holds: counted as `x*` (any number).
const OWN_PIPES: &str = "pipe (both ends its own)";

/// `mode what`: a pipe by who else holds it, a socket by kind, state, local address and
/// network namespace, a namespace by name, a file by kind and symbolic path.
fn describe_fd(
    fd: &RawFd,
    owner: &Observation,
    observed: &Observed,
    namespaces: &Namespaces,
    context: &Context,
) -> String {
    let mode = access(fd.flags);
    let inode = |prefix: &str| -> Option<u64> {
        fd.link
            .strip_prefix(prefix)?
            .strip_suffix(']')?
            .parse()
            .ok()
    };
    let what = if inode("pipe:[").is_some() {
        let mut holders: Vec<String> = Vec::new();
        let everyone = std::iter::once(("adapter", &observed.adapter))
            .chain(observed.procs.iter().map(|o| (o.role.as_str(), &o.raw)));
        for (role, raw) in everyone {
            if role != owner.role && raw.fds.iter().any(|f| f.link == fd.link) {
                holders.push(role.to_string());
            }
        }
        let inherited = observed.starter.fds.iter().any(|f| f.link == fd.link);
        let both_ends = owner.raw.fds.iter().filter(|f| f.link == fd.link).count() > 1;
        match (inherited, holders.is_empty()) {
            // Planted by the test before it started the adapter (see posture.rs).
            (true, _) => "pipe the adapter inherited from its starter".to_string(),
            // A pool of the program's own (pasta's splice pipes): how many it holds is its
            // business, and its timers' (see `fds`).
            (false, true) if both_ends => OWN_PIPES.to_string(),
            (false, true) => "pipe (no other listed holder)".to_string(),
            (false, false) => format!("pipe with {}", holders.join("+")),
        }
    } else if fd.link.starts_with("socket:[") {
        match &fd.socket {
            Some(s) => {
                let mut text = format!("socket {}", s.kind);
                let of_adapter =
                    s.ns.is_some_and(|ns| observed.adapter.ns.get("net") == Some(&ns));
                for part in [s.state.clone(), address(&s.local, s, of_adapter, context)] {
                    if !part.is_empty() {
                        text.push(' ');
                        text.push_str(&part);
                    }
                }
                if let Some(ns) = s.ns {
                    text.push_str(&format!(" net={}", namespaces.name("net", ns)));
                }
                text
            }
            None => "socket (unreadable)".into(),
        }
    } else if let Some(rest) = fd.link.strip_prefix("anon_inode:") {
        match fd.pid {
            Some(pid) => {
                let role = std::iter::once(("adapter", observed.adapter.pid))
                    .chain(observed.procs.iter().map(|o| (o.role.as_str(), o.raw.pid)))
                    .find(|(_, p)| *p == pid)
                    .map_or("an unlisted process", |(role, _)| role);
                format!("{rest} of {role}")
            }
            None => rest.to_string(),
        }
    } else if let Some((kind, rest)) = fd.link.split_once(":[") {
        match rest.strip_suffix(']').and_then(|i| i.parse::<u64>().ok()) {
            Some(ns) if NS_KINDS.contains(&kind) => {
                format!("ns {kind} {}", namespaces.name(kind, ns))
            }
            _ => fd.link.clone(),
        }
    } else if let Some(name) = fd.link.strip_prefix("/memfd:") {
        format!("memfd {name}")
    } else {
        format!(
            "{} {}",
            file_kind(fd.file_type),
            path(&fd.link, context, fd.target)
        )
    };
    format!("{mode} {what}")
}

/// A socket's local address: loopback and wildcard addresses as they are, the gate's link
/// addresses as their symbols, and any other address of a namespace the adapter made as it
/// is; the engine's
/// port as `{engine}`, an ephemeral port (not listening) as `*`; any other address of the
/// adapter's (the host's) namespace as `{host}`.
fn address(local: &str, socket: &Socket, of_adapter: bool, context: &Context) -> String {
    if socket.kind.starts_with("unix") || local.is_empty() {
        return match local {
            "" => String::new(),
            name if name.starts_with('@') => "@abstract".into(),
            name => path(name, context, None),
        };
    }
    let Some((ip, port)) = local.rsplit_once(':') else {
        return local.into();
    };
    let bare = ip.trim_start_matches('[').trim_end_matches(']');
    let known = matches!(bare, "127.0.0.1" | "0.0.0.0" | "::" | "::1") || bare.starts_with("127.");
    let gate = context
        .gate
        .iter()
        .find(|(address, _)| !of_adapter && address == bare);
    let ip = if let Some((_, symbol)) = gate {
        ip.replace(bare, symbol)
    } else if known || !of_adapter {
        ip.to_string()
    } else {
        "{host}".into()
    };
    if (bare == "0.0.0.0" || bare == "::") && port == "0" {
        return "unbound".into();
    }
    let port = match port.parse::<u16>() {
        Ok(p) if p == context.engine_port && p != 0 => "{engine}".to_string(),
        Ok(p) if socket.state != "listen" && p >= 1024 => "*".into(),
        _ => port.to_string(),
    };
    format!("{ip}:{port}")
}

/// A path in symbols: the run's directories and names replaced, a temporary directory of
/// the harness as `{tmp}`, system directories kept. Any other path is kept as it is when it
/// names a file of the process's own mount namespace (`target`, the file's device and inode,
/// is not what the path is on the host: a jail's `/disk.img`), else it is this host's and
/// shows as `{host}/<file name>`.
pub fn path(text: &str, context: &Context, target: Option<(u64, u64)>) -> String {
    let (text, deleted) = match text.strip_suffix(" (deleted)") {
        Some(t) => (t, " (deleted)"),
        None => (text, ""),
    };
    let mut out = text.to_string();
    let mut prefixes = context.paths.clone();
    prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
    for (prefix, symbol) in &prefixes {
        if out == *prefix || out.starts_with(&format!("{prefix}/")) {
            out = format!("{symbol}{}", &out[prefix.len()..]);
            break;
        }
    }
    for (name, symbol) in &context.names {
        out = out.replace(name.as_str(), symbol);
    }
    if !out.starts_with('{') && out.starts_with('/') {
        // A directory tempfile made (`.tmpXXXXXX`), wherever it is.
        if let Some(at) = out.find("/.tmp") {
            let rest = out[at + 1..].split_once('/').map_or("", |(_, r)| r);
            out = match rest {
                "" => "{tmp}".into(),
                rest => format!("{{tmp}}/{rest}"),
            };
        }
    }
    const SYSTEM: [&str; 9] = [
        "/dev/", "/proc/", "/sys/", "/usr/", "/lib", "/etc/", "/bin/", "/sbin/", "/tmp/",
    ];
    let kept = out.starts_with('{')
        || out == "/"
        || SYSTEM.iter().any(|s| out.starts_with(s))
        || !out.starts_with('/');
    if !kept {
        let on_host = std::fs::metadata(&out).ok().map(|m| {
            (
                std::os::unix::fs::MetadataExt::dev(&m),
                std::os::unix::fs::MetadataExt::ino(&m),
            )
        });
        // Not a file of the host's (no such path here, or another file there): a path of
        // the process's own mount namespace, which says nothing of this host.
        let its_own = on_host.is_none() || (target.is_some() && on_host != target);
        if !its_own {
            let name = out.rsplit('/').next().unwrap_or("");
            out = format!("{{host}}/{name}");
        }
    }
    format!("{out}{deleted}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> Context {
        Context {
            paths: vec![
                ("/tmp/.tmpAbC/state".into(), "{state}".into()),
                ("/srv/cache".into(), "{cache}".into()),
            ],
            names: vec![(
                "1b4e28ba-2fa1-11d2-883f-0016d3cca427".into(),
                "{net}".into(),
            )],
            engine_port: 49134,
            sandbox_nofile: None,
            gate: vec![
                ("172.30.253.2".into(), "{gate_v4}".into()),
                ("fd69:6969:6969::2".into(), "{gate_v6}".into()),
            ],
        }
    }

    #[test]
    fn paths_name_roles_never_this_hosts_directories() {
        let c = context();
        assert_eq!(
            path(
                "/tmp/.tmpAbC/state/sandboxes/1b4e28ba-2fa1-11d2-883f-0016d3cca427/sandbox.log",
                &c,
                None
            ),
            "{state}/sandboxes/{net}/sandbox.log"
        );
        assert_eq!(
            path("/srv/cache/x (deleted)", &c, None),
            "{cache}/x (deleted)"
        );
        assert_eq!(
            path("/tmp/.tmpZZZ/adapter.log", &c, None),
            "{tmp}/adapter.log"
        );
        assert_eq!(path("/dev/null", &c, None), "/dev/null");
        assert_eq!(path("/etc/hostname", &c, None), "/etc/hostname");
        let here = std::env::current_exe().unwrap();
        let name = here.file_name().unwrap().to_string_lossy();
        assert_eq!(
            path(&here.display().to_string(), &c, None),
            format!("{{host}}/{name}")
        );
        // A file of a jail's own mount namespace (no such file here, or another one).
        assert_eq!(path("/image/disk.img", &c, Some((1, 2))), "/image/disk.img");
        assert_eq!(path("/", &c, None), "/");
    }

    #[test]
    fn socket_addresses_keep_loopback_and_hide_the_hosts() {
        let c = context();
        let socket = |kind: &str, state: &str| Socket {
            kind: kind.into(),
            state: state.into(),
            local: String::new(),
            ns: None,
        };
        assert_eq!(
            address("127.0.0.1:53", &socket("udp4", ""), true, &c),
            "127.0.0.1:53"
        );
        assert_eq!(
            address("127.0.0.1:49134", &socket("tcp4", "listen"), true, &c),
            "127.0.0.1:{engine}"
        );
        assert_eq!(
            address("10.1.2.3:40000", &socket("udp4", ""), true, &c),
            "{host}:*"
        );
        assert_eq!(
            address("[::1]:53", &socket("tcp6", "listen"), true, &c),
            "[::1]:53"
        );
        assert_eq!(
            address("0.0.0.0:0", &socket("tcp4", ""), true, &c),
            "unbound"
        );
        // A namespace the adapter made: the gate's link addresses as this host's choice of
        // them, any other as it is.
        assert_eq!(
            address("172.30.253.2:53", &socket("udp4", ""), false, &c),
            "{gate_v4}:53"
        );
        assert_eq!(
            address(
                "[fd69:6969:6969::2]:53",
                &socket("tcp6", "listen"),
                false,
                &c
            ),
            "[{gate_v6}]:53"
        );
        assert_eq!(
            address("10.0.2.2:53", &socket("udp4", ""), false, &c),
            "10.0.2.2:53"
        );
    }
}
