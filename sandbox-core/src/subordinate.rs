//! Subordinate host ids (`/etc/subuid`, `/etc/subgid`): the unprivileged host ids a root
//! adapter gives what it runs for sandboxes (a bwrap sandbox's ids, the user namespace and
//! pasta of a libkrun sandbox's network), and an ordinary user's ranges.

/// The host ids a root adapter's sandboxes get when `/etc/subuid` names no range for root:
/// high enough to collide with no ordinary account or the usual `useradd` ranges.
pub const DEFAULT_ROOT_BASE: u32 = 2_000_000_000;
/// The ids a sandbox has when the adapter may map a whole range.
pub const RANGE: u32 = 65_536;

/// The first host uid and gid of a root adapter's range: `/etc/subuid`'s and `/etc/subgid`'s
/// entry for root of at least [`RANGE`] ids, else [`DEFAULT_ROOT_BASE`].
pub fn root_bases() -> (u32, u32) {
    let range = |file: &str| {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|text| subordinate_range(&text, &["root", "0"], RANGE))
    };
    (
        range("/etc/subuid").unwrap_or(DEFAULT_ROOT_BASE),
        range("/etc/subgid").unwrap_or(DEFAULT_ROOT_BASE),
    )
}

/// The first range of at least `needed` ids that `/etc/subuid`-format `text` gives one of
/// `names` (a user's name or its number).
pub fn subordinate_range(text: &str, names: &[&str], needed: u32) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut fields = line.trim().split(':');
        let (Some(name), Some(start), Some(count)) = (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        let (start, count) = (start.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
        (names.contains(&name)
            && count >= needed
            && start > 0
            && start.checked_add(needed).is_some())
        .then_some(start)
    })
}
