//! The sandbox ruleset's address sets as the proxy fills them: each change one `nft`
//! transaction, run in the sandbox's network namespace, an answer given only once its
//! addresses are in.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::network::{SET_SIZE, TABLE};

/// A set element whose timeout is this close to what an answer asks is left as it is.
const REFRESH_SLACK: Duration = Duration::from_secs(5);

/// One `nft` transaction for some elements: its script, how long to wait before running it
/// (an element about to expire is added again once it has), and the elements it changes.
struct Plan {
    script: String,
    wait: Option<Duration>,
    changed: Vec<(&'static str, IpAddr, u32)>,
}

/// The sets of the sandbox's ruleset as this proxy filled them, and how to change them.
pub struct Sets {
    nft: String,
    /// (set, address) -> when the element expires: no earlier than the first, no later than
    /// the second instant (`nft` takes a while to commit).
    known: HashMap<(&'static str, IpAddr), (Instant, Instant)>,
}

impl Sets {
    pub fn new(nft: String) -> Self {
        Sets {
            nft,
            known: HashMap::new(),
        }
    }

    /// Puts `elements` in their sets with their timeouts (refreshing those already there),
    /// in one `nft` transaction.
    pub fn add(&mut self, elements: &[(&'static str, IpAddr, u32)]) -> Result<(), String> {
        let now = Instant::now();
        let plan = self.plan(elements, now)?;
        if plan.script.is_empty() {
            return Ok(());
        }
        if let Some(wait) = plan.wait {
            std::thread::sleep(wait);
        }
        let before = Instant::now();
        self.run(&plan.script)?;
        let after = Instant::now();
        // Only what the script changed: an element left alone keeps the expiry it had.
        for (set, addr, timeout) in plan.changed {
            let timeout = Duration::from_secs(u64::from(timeout));
            self.known
                .insert((set, addr), (before + timeout, after + timeout));
        }
        Ok(())
    }

    /// The `nft` script for `elements` at `now` (see [`Plan`]).
    fn plan(
        &mut self,
        elements: &[(&'static str, IpAddr, u32)],
        now: Instant,
    ) -> Result<Plan, String> {
        self.known.retain(|_, (_, latest)| *latest > now);
        // One element once, with the longest timeout asked (an answer may repeat a record).
        let mut wanted: Vec<(&'static str, IpAddr, u32)> = Vec::new();
        for &(set, addr, timeout) in elements {
            match wanted.iter_mut().find(|(s, a, _)| *s == set && *a == addr) {
                Some(seen) => seen.2 = seen.2.max(timeout),
                None => wanted.push((set, addr, timeout)),
            }
        }
        let mut plan = Plan {
            script: String::new(),
            wait: None,
            changed: Vec::new(),
        };
        for (set, addr, timeout) in wanted {
            let lasting = Duration::from_secs(u64::from(timeout));
            match self.known.get(&(set, addr)) {
                Some((earliest, _)) if *earliest + REFRESH_SLACK >= now + lasting => continue,
                // Surely there still: replaced in the same transaction.
                Some((earliest, _)) if *earliest > now + Duration::from_secs(1) => {
                    plan.script
                        .push_str(&format!("delete element {TABLE} {set} {{ {addr} }}\n"));
                }
                Some((_, latest)) => {
                    let until = latest.saturating_duration_since(now) + Duration::from_millis(50);
                    plan.wait = Some(plan.wait.map_or(until, |w: Duration| w.max(until)));
                }
                None => {
                    let in_set = self.known.keys().filter(|(s, _)| *s == set).count();
                    if in_set >= SET_SIZE {
                        return Err(format!("the set {set} is full ({SET_SIZE} addresses)"));
                    }
                }
            }
            plan.script.push_str(&format!(
                "add element {TABLE} {set} {{ {addr} timeout {timeout}s }}\n"
            ));
            plan.changed.push((set, addr, timeout));
        }
        Ok(plan)
    }

    fn run(&self, script: &str) -> Result<(), String> {
        run_nft(&self.nft, script)
    }
}

/// Runs `nft -f -` with `script` (in this process's network namespace: the sandbox's), one
/// transaction.
pub(crate) fn run_nft(nft: &str, script: &str) -> Result<(), String> {
    let mut command = Command::new(nft);
    command
        .args(["-f", "-"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run {nft}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let mut errors = String::new();
    if let Some(stderr) = child.stderr.take() {
        let _ = stderr.take(4096).read_to_string(&mut errors);
    }
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for {nft}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{nft} could not update the sets ({status}): {}",
            errors.trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{ALLOW_V4, ALLOW_V6, DENY_V4};
    use std::net::Ipv6Addr;

    #[test]
    fn the_plan_adds_new_elements_refreshes_old_ones_and_bounds_the_set() {
        let mut sets = Sets::new("nft".into());
        let ip: IpAddr = "198.51.100.10".parse().unwrap();
        let now = Instant::now();
        let plan = sets
            .plan(&[(ALLOW_V4, ip, 60), (ALLOW_V4, ip, 90)], now)
            .unwrap();
        // Once, with the longer timeout.
        assert_eq!(
            plan.script,
            "add element inet iii_egress allow_names_v4 { 198.51.100.10 timeout 90s }\n"
        );
        assert_eq!(plan.wait, None);
        assert_eq!(plan.changed, [(ALLOW_V4, ip, 90)]);
        let sixty = Duration::from_secs(60);
        sets.known
            .insert((ALLOW_V4, ip), (now + sixty, now + sixty));
        // Asked again at once: nothing to do, nothing changed.
        let plan = sets.plan(&[(ALLOW_V4, ip, 60)], now).unwrap();
        assert_eq!(plan.script, "");
        assert!(plan.changed.is_empty());
        // Half-way: replaced in one transaction; the other element asked with it is new.
        let later = now + Duration::from_secs(30);
        let other: IpAddr = "198.51.100.11".parse().unwrap();
        let plan = sets
            .plan(&[(ALLOW_V4, ip, 60), (DENY_V4, other, 60)], later)
            .unwrap();
        assert!(plan.script.starts_with("delete element"), "{}", plan.script);
        assert_eq!(plan.wait, None);
        assert_eq!(plan.changed.len(), 2);
        // About to expire: added again once it has.
        let edge = now + Duration::from_millis(59_500);
        let plan = sets.plan(&[(ALLOW_V4, ip, 60)], edge).unwrap();
        assert!(plan.script.starts_with("add element"), "{}", plan.script);
        assert!(plan.wait.unwrap() <= Duration::from_millis(600));
        // A full set refuses another address.
        for i in 0..SET_SIZE {
            let other = IpAddr::V6(Ipv6Addr::from(i as u128 + 1));
            sets.known
                .insert((ALLOW_V6, other), (now + sixty, now + sixty));
        }
        let new: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(sets.plan(&[(ALLOW_V6, new, 60)], now).is_err());
    }
}
