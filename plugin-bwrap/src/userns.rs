//! The sandbox's user namespace: why its root is never the host's root.
//!
//! Every sandbox runs in a user namespace of its own, made by its launcher before the sandbox
//! is known:
//! - **adapter run as root**: ids `0..count` inside are host ids `base..base+count` (a
//!   subordinate range: `/etc/subuid`'s entry for root, else [`DEFAULT_ROOT_BASE`]). The
//!   image cache and the sandbox's layer stay on disk with the image's own owners; the launcher
//!   shows them to the sandbox through idmapped mounts (`mount_setattr(MOUNT_ATTR_IDMAP)`), so
//!   a file the image gives uid 0 is uid 0 inside and host uid `base` to the kernel. Chosen
//!   over a shifted copy of each root: one syscall per mount instead of a chown walk of every
//!   image, and the cache stays shared with the libkrun plugin unchanged.
//! - **adapter run as an ordinary user** (how Compose runs it): the one id it owns is root
//!   inside (`0 -> the adapter's uid`). Its image cache is already owned by that uid, so no
//!   idmapping is needed (nor possible: it takes host privilege). When the user has
//!   subordinate ranges (`/etc/subuid`, `/etc/subgid`, at least 65535 ids each) and Debian's
//!   `uidmap` setuid helpers are installed, ids `1..65536` inside are those ranges (written
//!   by `newuidmap`/`newgidmap`, the only way an unprivileged process may map more than
//!   itself), so programs that switch to another uid inside work; a tree such ids wrote on
//!   the host is removed from a namespace of the same map ([`remove_tree_as_sandbox`]).
//!   Without them only the one id is mapped and such programs fail (EINVAL): the README
//!   and `adapter::info` say which.
//!
//! Either way the sandbox's capabilities are those of its own namespace: useless against the
//! host's files, kernel knobs and other tenants.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::sched::{setns, CloneFlags};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};

use sandbox_core::subordinate::{root_bases, subordinate_range};
pub use sandbox_core::subordinate::{DEFAULT_ROOT_BASE, RANGE};

/// Which host ids a sandbox's ids `0..count` are, and (an ordinary user's) which host ids
/// its ids `1..RANGE` are besides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub uid_base: u32,
    pub gid_base: u32,
    pub count: u32,
    pub subordinate: Option<Subordinate>,
}

/// An ordinary user's subordinate ranges: ids `1..RANGE` inside are host ids
/// `uid_start..uid_start + RANGE - 1` (and the same for groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subordinate {
    pub uid_start: u32,
    pub gid_start: u32,
}

/// Where Debian's `uidmap` package puts its setuid helpers.
const NEWUIDMAP: &str = "/usr/bin/newuidmap";
const NEWGIDMAP: &str = "/usr/bin/newgidmap";

impl IdMap {
    /// The mapping for an adapter running with these effective ids.
    pub fn for_process(euid: u32, egid: u32) -> IdMap {
        if euid != 0 {
            return IdMap {
                uid_base: euid,
                gid_base: egid,
                count: 1,
                subordinate: Subordinate::of_user(euid),
            };
        }
        let (uid_base, gid_base) = root_bases();
        IdMap {
            uid_base,
            gid_base,
            count: RANGE,
            subordinate: None,
        }
    }

    /// Ids the sandbox has: 1 when only the adapter's own is mapped.
    pub fn ids_inside(&self) -> u32 {
        if self.subordinate.is_some() {
            RANGE
        } else {
            self.count
        }
    }

    /// Whether the sandbox's files must be shown through idmapped mounts: the on-disk owners
    /// are the image's own ids, which the sandbox's namespace does not map one to one.
    pub fn needs_idmapped_mounts(&self) -> bool {
        self.count > 1
    }

    /// `UID:GID:COUNT` (and `:SUBUID:SUBGID` with subordinate ranges), the launcher's
    /// `--id-map` argument.
    pub fn to_arg(self) -> String {
        let own = format!("{}:{}:{}", self.uid_base, self.gid_base, self.count);
        match self.subordinate {
            Some(sub) => format!("{own}:{}:{}", sub.uid_start, sub.gid_start),
            None => own,
        }
    }

    pub fn parse_arg(text: &str) -> Option<IdMap> {
        let parts: Vec<u32> = text
            .split(':')
            .map(|p| p.parse::<u32>().ok())
            .collect::<Option<_>>()?;
        let (uid_base, gid_base, count, subordinate) = match parts[..] {
            [uid, gid, count] => (uid, gid, count, None),
            // Subordinate ranges go with an ordinary user's single own id only.
            [uid, gid, 1, uid_start, gid_start] => (
                uid,
                gid,
                1,
                Some(Subordinate {
                    uid_start,
                    gid_start,
                }),
            ),
            _ => return None,
        };
        let fits = |base: u32, count: u32| base.checked_add(count).is_some();
        let subordinate_fits = subordinate.is_none_or(|sub| {
            sub.uid_start > 0
                && sub.gid_start > 0
                && fits(sub.uid_start, RANGE - 1)
                && fits(sub.gid_start, RANGE - 1)
        });
        (count > 0 && fits(uid_base, count) && fits(gid_base, count) && subordinate_fits).then_some(
            IdMap {
                uid_base,
                gid_base,
                count,
                subordinate,
            },
        )
    }

    /// One line, for `adapter::info` and the log.
    pub fn describe(&self) -> String {
        if let Some(sub) = self.subordinate {
            format!(
                "sandbox root is host uid {} (the adapter's own); sandbox ids 1..{RANGE} are \
                 its subordinate host ids {}.. (uid), {}.. (gid), mapped by newuidmap/newgidmap",
                self.uid_base, sub.uid_start, sub.gid_start
            )
        } else if self.count == 1 {
            format!(
                "sandbox root is host uid {} (the adapter's own; no other id is mapped: no \
                 subordinate range of {} ids in /etc/subuid and /etc/subgid, or no \
                 newuidmap/newgidmap)",
                self.uid_base,
                RANGE - 1
            )
        } else {
            format!(
                "sandbox ids 0..{} are host ids {}..{} (uid), {}..{} (gid)",
                self.count,
                self.uid_base,
                u64::from(self.uid_base) + u64::from(self.count),
                self.gid_base,
                u64::from(self.gid_base) + u64::from(self.count)
            )
        }
    }
}

impl Subordinate {
    /// The ranges `/etc/subuid` and `/etc/subgid` give the user `uid` (by name or number),
    /// when both hold [`RANGE`]` - 1` ids and the setuid helpers that map them are installed.
    fn of_user(uid: u32) -> Option<Subordinate> {
        if ![NEWUIDMAP, NEWGIDMAP]
            .iter()
            .all(|helper| Path::new(helper).is_file())
        {
            return None;
        }
        let name = nix::unistd::User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()?
            .name;
        let number = uid.to_string();
        let range = |file: &str| {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|text| subordinate_range(&text, &[&name, &number], RANGE - 1))
        };
        Some(Subordinate {
            uid_start: range("/etc/subuid")?,
            gid_start: range("/etc/subgid")?,
        })
    }
}

/// Makes a user namespace with `map` and returns a handle on it. The namespace is made by a
/// short-lived child (a process cannot write its own full map), and outlives it through the
/// returned descriptor. A root adapter's child first becomes the sandbox's root host id, so
/// that id owns the namespace: pasta, running as it, may then join (see `netns.rs`). Call only
/// while single-threaded (it forks).
pub fn create(map: IdMap) -> io::Result<OwnedFd> {
    let owner = map
        .needs_idmapped_mounts()
        .then_some((map.uid_base, map.gid_base));
    idmap_mount::new_user_namespace(owner, |pid| write_maps(pid, map))
}

fn write_maps(pid: i32, map: IdMap) -> io::Result<()> {
    if let Some(sub) = map.subordinate {
        return write_maps_with_helpers(pid, map, sub);
    }
    let proc_file = |name: &str| format!("/proc/{pid}/{name}");
    if map.count == 1 {
        // An unprivileged owner may map its own ids only, and only with setgroups denied.
        std::fs::write(proc_file("setgroups"), "deny")?;
    }
    let write = |name: &str, base: u32| {
        std::fs::write(proc_file(name), format!("0 {base} {}\n", map.count))
            .map_err(|e| io::Error::new(e.kind(), format!("cannot write {name}: {e}")))
    };
    write("uid_map", map.uid_base)?;
    write("gid_map", map.gid_base)
}

/// `0 <own id> 1` and `1 <subordinate start> 65535`, through the setuid helpers (which check
/// the ranges against `/etc/subuid` and `/etc/subgid` themselves).
fn write_maps_with_helpers(pid: i32, map: IdMap, sub: Subordinate) -> io::Result<()> {
    let rest = (RANGE - 1).to_string();
    for (helper, own, start) in [
        (NEWUIDMAP, map.uid_base, sub.uid_start),
        (NEWGIDMAP, map.gid_base, sub.gid_start),
    ] {
        let output = std::process::Command::new(helper)
            .args([pid.to_string(), "0".into(), own.to_string(), "1".into()])
            .args(["1".into(), start.to_string(), rest.clone()])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {helper}: {e}")))?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "{helper} refused the sandbox's ids ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// Joins the namespace and becomes its root (uid and gid 0 inside, no supplementary groups),
/// with every capability of that namespace and none of the host's.
pub fn enter(userns: &OwnedFd, map: IdMap) -> io::Result<()> {
    setns(userns, CloneFlags::CLONE_NEWUSER)
        .map_err(|e| io::Error::other(format!("cannot enter the sandbox's user namespace: {e}")))?;
    // setgroups is denied in a single-id namespace (the host groups the adapter's user has
    // stay, unmapped); with a full map they are dropped.
    if map.ids_inside() > 1 {
        setgroups(&[]).map_err(|e| io::Error::other(format!("cannot drop groups: {e}")))?;
    }
    let root_gid = Gid::from_raw(0);
    let root_uid = Uid::from_raw(0);
    setresgid(root_gid, root_gid, root_gid)
        .and_then(|()| setresuid(root_uid, root_uid, root_uid))
        .map_err(|e| io::Error::other(format!("cannot become the namespace's root: {e}")))
}

/// Removes `path` from a user namespace of `map` (as the sandbox's root, who may remove what
/// any of its ids wrote), through the launcher's `--remove-tree` mode. For a tree the
/// adapter's user cannot remove itself: an ordinary user's subordinate ids wrote in it.
pub fn remove_tree_as_sandbox(launcher: &Path, path: &Path, map: IdMap) -> io::Result<()> {
    let output = std::process::Command::new(launcher)
        .arg("--remove-tree")
        .arg(path)
        .args(["--id-map", &map.to_arg()])
        .stdin(std::process::Stdio::null())
        .output()?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "removing {} as the sandbox's ids failed ({}): {}",
        path.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_user_maps_itself_as_root_and_never_needs_idmapped_mounts() {
        let map = IdMap::for_process(1000, 1001);
        assert_eq!((map.uid_base, map.gid_base, map.count), (1000, 1001, 1));
        assert!(!map.needs_idmapped_mounts());
        match map.subordinate {
            Some(_) => assert_eq!(map.ids_inside(), RANGE),
            None => assert_eq!(map.ids_inside(), 1),
        }
    }

    #[test]
    fn root_never_maps_host_root() {
        let map = IdMap::for_process(0, 0);
        assert_eq!(map.count, RANGE);
        assert!(map.uid_base > 0 && map.gid_base > 0);
        assert!(map.needs_idmapped_mounts());
    }

    #[test]
    fn subordinate_ranges_are_read_for_the_user_only_when_big_enough() {
        let text = "alice:100000:65536\nroot:200000:1000\nroot:300000:65536\n1002:500000:65535\n";
        let root = |text: &str| subordinate_range(text, &["root"], RANGE);
        assert_eq!(root(text), Some(300000));
        assert_eq!(subordinate_range(text, &["alice"], RANGE), Some(100000));
        assert_eq!(subordinate_range(text, &["bob"], RANGE), None);
        assert_eq!(
            subordinate_range(text, &["carol", "1002"], RANGE - 1),
            Some(500000)
        );
        assert_eq!(subordinate_range(text, &["carol", "1002"], RANGE), None);
        assert_eq!(root("root:0:65536\n"), None);
        assert_eq!(root("root:4294967000:65536\n"), None);
        assert_eq!(root("garbage\nroot:x:y\n"), None);
    }

    #[test]
    fn the_argument_round_trips_and_refuses_nonsense() {
        let map = IdMap {
            uid_base: 5,
            gid_base: 6,
            count: 7,
            subordinate: None,
        };
        assert_eq!(IdMap::parse_arg(&map.to_arg()), Some(map));
        let user = IdMap {
            uid_base: 1001,
            gid_base: 1001,
            count: 1,
            subordinate: Some(Subordinate {
                uid_start: 100000,
                gid_start: 200000,
            }),
        };
        assert_eq!(user.to_arg(), "1001:1001:1:100000:200000");
        assert_eq!(IdMap::parse_arg(&user.to_arg()), Some(user));
        assert_eq!(user.ids_inside(), RANGE);
        assert!(!user.needs_idmapped_mounts());
        for bad in [
            "",
            "1:2",
            "1:2:3:4",
            "a:2:3",
            "1:2:0",
            "4294967295:0:2",
            "1:2:7:3:4",
            "1:2:1:0:4",
            "1:2:1:4294967000:4",
            "1:2:1:3:4:5",
        ] {
            assert_eq!(IdMap::parse_arg(bad), None, "{bad}");
        }
    }
}
