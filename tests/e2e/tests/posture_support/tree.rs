//! The processes an adapter started, each given a role that holds from run to run:
//! `<group>.<name>`, where the group is the sandbox it serves (`net`, `nonet`, `worker`, as
//! the test named them) or `pool` (started ahead of a create), and the name comes from what
//! the process is (`bwrap`, `agent`, `pasta`, `dns-proxy`, `fuse2fs-jail`, ...). A process
//! of the guest (below the agent) is not the adapter's and is left out.

use std::collections::BTreeMap;

use super::procfs;

/// One process found: role, parent's role, pid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub role: String,
    pub parent: String,
    pub pid: u32,
}

/// Every live process of the host: pid -> (ppid, comm, exe).
pub fn processes() -> BTreeMap<u32, (u32, String, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (comm, ppid, state) = procfs::stat(&format!("/proc/{pid}"))?;
            (state != "Z").then(|| {
                let exe = procfs::link(&format!("/proc/{pid}/exe"));
                (pid, (ppid, comm, exe))
            })
        })
        .collect()
}

/// The file name of an executable's path (as `/proc/PID/exe` shows it).
pub fn program(exe: &str) -> &str {
    let name = exe.rsplit('/').next().unwrap_or(exe);
    name.strip_suffix(" (deleted)").unwrap_or(name)
}

/// What a process is, from its name and program; `under_adapter` for the adapter's own
/// children.
fn name_of(comm: &str, exe: &str, under_adapter: bool) -> String {
    let program = program(exe);
    match (comm, program) {
        ("iii-dns-proxy", _) => "dns-proxy".into(),
        ("iii-bus-forward", _) => "bus-forward".into(),
        (_, p) if p.starts_with("passt") || p.starts_with("pasta") => "pasta".into(),
        (".iii-agent", _) | (_, "sandbox-agent" | ".iii-agent") => "agent".into(),
        (_, "sandbox-bwrap-launch") if under_adapter => "launcher".into(),
        (_, "sandbox-bwrap-launch") => "launcher-fork".into(),
        (_, "sandbox-libkrun-vm") if under_adapter => "runner".into(),
        (_, "sandbox-libkrun-vm") => "runner-fork".into(),
        (_, "bwrap") if under_adapter => "bwrap".into(),
        // A bwrap below the sandbox's: a jail (of a FUSE daemon), named after what it holds.
        (_, "bwrap") => "jail".into(),
        (_, p) if !p.is_empty() && !p.starts_with('(') => p.into(),
        (c, _) => c.into(),
    }
}

/// The adapter's descendants with roles. `groups`: the processes the test knows by name
/// (a sandbox's root process), each with its group; the adapter's other children form the
/// group `pool` if they are launchers or runners started ahead, else `other`. Order: the
/// groups as given, then `pool`, then `other`; inside a group, parents before children,
/// siblings by name.
pub fn roles(adapter: u32, groups: &[(String, u32)]) -> Vec<Found> {
    let all = processes();
    let children = |parent: u32| -> Vec<u32> {
        let mut c: Vec<u32> = all
            .iter()
            .filter(|(_, (ppid, _, _))| *ppid == parent)
            .map(|(pid, _)| *pid)
            .collect();
        c.sort();
        c
    };
    let mut by_group: Vec<(String, Vec<u32>)> = groups
        .iter()
        .map(|(group, pid)| (group.clone(), vec![*pid]))
        .collect();
    let mut pool = Vec::new();
    let mut other = Vec::new();
    for child in children(adapter) {
        if groups.iter().any(|(_, pid)| *pid == child) {
            continue;
        }
        let (_, comm, exe) = &all[&child];
        match name_of(comm, exe, true).as_str() {
            "launcher" | "runner" => pool.push(child),
            _ => other.push(child),
        }
    }
    by_group.push(("pool".into(), pool));
    by_group.push(("other".into(), other));
    let mut found = Vec::new();
    for (group, tops) in by_group {
        let mut used: Vec<String> = Vec::new();
        for top in tops {
            walk(
                &all, &children, &group, top, "adapter", true, &mut used, &mut found,
            );
        }
    }
    found
}

/// What a jail holds: the first process below it, through bwrap's own init, that is not
/// bwrap (`unknown` if there is no single one).
fn jailed(
    all: &BTreeMap<u32, (u32, String, String)>,
    children: &dyn Fn(u32) -> Vec<u32>,
    jail: u32,
) -> String {
    let mut at = jail;
    for _ in 0..4 {
        let [only] = children(at)[..] else {
            break;
        };
        let Some((_, comm, exe)) = all.get(&only) else {
            break;
        };
        if program(exe) != "bwrap" {
            return name_of(comm, exe, false);
        }
        at = only;
    }
    "unknown".into()
}

#[allow(clippy::too_many_arguments)]
fn walk(
    all: &BTreeMap<u32, (u32, String, String)>,
    children: &dyn Fn(u32) -> Vec<u32>,
    group: &str,
    pid: u32,
    parent: &str,
    under_adapter: bool,
    used: &mut Vec<String>,
    found: &mut Vec<Found>,
) {
    let Some((_, comm, exe)) = all.get(&pid) else {
        return;
    };
    let mut name = name_of(comm, exe, under_adapter);
    let kids = children(pid);
    if name == "jail" {
        // bwrap's own init of the jail's pid namespace, below the jail itself.
        name = match parent.split_once('.') {
            Some((_, jail)) if jail.ends_with("-jail") => format!("{jail}-init"),
            _ => format!("{}-jail", jailed(all, children, pid)),
        };
    }
    let mut role = format!("{group}.{name}");
    let mut n = 1;
    while used.contains(&role) {
        n += 1;
        role = format!("{group}.{name}-{n}");
    }
    used.push(role.clone());
    found.push(Found {
        role: role.clone(),
        parent: parent.into(),
        pid,
    });
    if name == "agent" {
        return; // what runs below it is the guest's
    }
    let mut kids: Vec<(String, u32)> = kids
        .into_iter()
        .filter_map(|kid| {
            let (_, comm, exe) = all.get(&kid)?;
            Some((name_of(comm, exe, false), kid))
        })
        .collect();
    kids.sort();
    for (_, kid) in kids {
        walk(all, children, group, kid, &role, false, used, found);
    }
}
