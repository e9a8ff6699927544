//! What a guest may do on the bus: the operator's lists (`sandbox_bus_call`,
//! `sandbox_bus_register`) under the rules no list can widen.
//!
//! Never, whatever the lists say: an id under the adapter's own prefix, the router's
//! `sandbox::`, `configuration::` or `engine::` (except [`SDK_ENGINE_CALLS`], which the
//! official SDKs make for their own working), a worker under the adapter's name. Ids another
//! worker holds are the engine's to refuse (`registrationrejected`), which the relay passes on.

use std::fmt;

use crate::pattern::{Pattern, PatternError};

/// The `engine::` calls the official SDKs make by themselves, read in iii-sdk 0.25.0 (the
/// Rust crate's `iii.rs` and the Python package's `iii/iii.py`): the worker's announcement
/// after each connect (fire-and-forget) and the channel a large payload travels through.
/// The SDKs' other `engine::` ids (`functions::list`, `workers::list`, ...) are only called
/// when a program asks: they tell a guest about the host's workers, so they stay refused.
pub const SDK_ENGINE_CALLS: &[&str] = &["engine::workers::register", "engine::channels::create"];

/// The worker announcement among [`SDK_ENGINE_CALLS`]: its `name` is checked.
pub const WORKER_ANNOUNCEMENT: &str = "engine::workers::register";

/// Prefixes no guest may call or register under, besides the adapter's own.
pub const RESERVED_PREFIXES: &[&str] = &["sandbox::", "configuration::", "engine::"];

/// The configuration keys, as refusals name them.
pub const CALL_KEY: &str = "sandbox_bus_call";
pub const REGISTER_KEY: &str = "sandbox_bus_register";

/// Why something a guest sent is refused; its text names the rule, for the guest's SDK and
/// the adapter's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Under a prefix no sandbox may touch.
    Reserved { id: String, prefix: String },
    /// Not matched by the operator's list.
    NotListed { id: String, key: &'static str },
    /// A worker announced under the adapter's own name.
    AdapterWorkerName { name: String },
    /// One of the guard's bounds.
    Limit { what: String },
}

impl Refusal {
    /// The rule, short, for the adapter's log (no payload, no id).
    pub fn rule(&self) -> String {
        match self {
            Refusal::Reserved { prefix, .. } => format!("reserved:{prefix}"),
            Refusal::NotListed { key, .. } => (*key).to_string(),
            Refusal::AdapterWorkerName { .. } => "adapter worker name".into(),
            Refusal::Limit { .. } => "limit".into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Reserved { id, prefix } => write!(
                f,
                "refused by the sandbox bus guard: `{id}` is under `{prefix}`, which no sandbox may call or register, whatever the adapter's configuration says"
            ),
            Refusal::NotListed { id, key } => write!(
                f,
                "refused by the sandbox bus guard: `{id}` matches no pattern of `{key}` in the adapter's configuration"
            ),
            Refusal::AdapterWorkerName { name } => write!(
                f,
                "refused by the sandbox bus guard: a sandbox may not announce itself as worker `{name}`, the adapter's own name"
            ),
            Refusal::Limit { what } => write!(f, "refused by the sandbox bus guard: {what}"),
        }
    }
}

/// A bad list in the configuration; the caller names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {index}: {reason}")]
pub struct PolicyError {
    pub key: &'static str,
    pub index: usize,
    pub reason: PatternError,
}

/// The rules of one adapter, shared by every sandbox's connections.
#[derive(Debug, Clone)]
pub struct Policy {
    call: Vec<Pattern>,
    register: Vec<Pattern>,
    /// `<adapter prefix>::` for each name the adapter's functions may be served under.
    adapter_prefixes: Vec<String>,
    adapter_workers: Vec<String>,
}

impl Policy {
    /// `call` and `register` as the configuration lists them; `adapter_prefixes` (without
    /// `::`) and `adapter_workers` are the adapter's own names, never a guest's.
    pub fn new(
        call: &[String],
        register: &[String],
        adapter_prefixes: &[String],
        adapter_workers: &[String],
    ) -> Result<Policy, PolicyError> {
        let patterns = |key: &'static str, list: &[String]| {
            list.iter()
                .enumerate()
                .map(|(index, text)| {
                    Pattern::new(text).map_err(|reason| PolicyError { key, index, reason })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let names = |list: &[String]| {
            let mut names: Vec<String> = list
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect();
            names.sort();
            names.dedup();
            names
        };
        Ok(Policy {
            call: patterns(CALL_KEY, call)?,
            register: patterns(REGISTER_KEY, register)?,
            adapter_prefixes: names(adapter_prefixes)
                .into_iter()
                .map(|p| format!("{p}::"))
                .collect(),
            adapter_workers: names(adapter_workers),
        })
    }

    /// The checks every list passes before use (configuration validation).
    pub fn check_list(key: &'static str, list: &[String]) -> Result<(), PolicyError> {
        for (index, text) in list.iter().enumerate() {
            Pattern::new(text).map_err(|reason| PolicyError { key, index, reason })?;
        }
        Ok(())
    }

    /// Whether a guest may invoke `id`.
    pub fn may_call(&self, id: &str) -> Result<(), Refusal> {
        if SDK_ENGINE_CALLS.contains(&id) {
            return Ok(());
        }
        self.reserved(id)?;
        if self.call.iter().any(|p| p.matches(id)) {
            Ok(())
        } else {
            Err(Refusal::NotListed {
                id: id.into(),
                key: CALL_KEY,
            })
        }
    }

    /// Whether a guest may register `id` (the SDKs' own calls included: nobody serves
    /// `engine::` but the engine).
    pub fn may_register(&self, id: &str) -> Result<(), Refusal> {
        self.reserved(id)?;
        if self.register.iter().any(|p| p.matches(id)) {
            Ok(())
        } else {
            Err(Refusal::NotListed {
                id: id.into(),
                key: REGISTER_KEY,
            })
        }
    }

    /// Whether a guest may announce itself as worker `name`.
    pub fn may_name_worker(&self, name: &str) -> Result<(), Refusal> {
        if self.adapter_workers.iter().any(|w| w == name.trim()) {
            return Err(Refusal::AdapterWorkerName { name: name.into() });
        }
        Ok(())
    }

    fn reserved(&self, id: &str) -> Result<(), Refusal> {
        let prefix = self
            .adapter_prefixes
            .iter()
            .map(String::as_str)
            .chain(RESERVED_PREFIXES.iter().copied())
            .find(|prefix| id.starts_with(prefix));
        match prefix {
            Some(prefix) => Err(Refusal::Reserved {
                id: id.into(),
                prefix: prefix.into(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn policy(call: &[&str], register: &[&str]) -> Policy {
        Policy::new(
            &strings(call),
            &strings(register),
            &strings(&["sandbox-libkrun", "sandbox-bwrap"]),
            &strings(&["sandbox-libkrun"]),
        )
        .unwrap()
    }

    #[test]
    fn by_default_a_guest_calls_nothing_but_what_its_sdk_needs() {
        let p = policy(&[], &["*"]);
        assert!(p.may_call("engine::workers::register").is_ok());
        assert!(p.may_call("engine::channels::create").is_ok());
        for id in [
            "math::add",
            "engine::functions::list",
            "engine::workers::list",
            "engine::functions::info",
        ] {
            assert!(p.may_call(id).is_err(), "{id}");
        }
    }

    #[test]
    fn the_call_list_opens_what_it_matches_and_nothing_reserved() {
        let p = policy(&["math::*", "*"], &["*"]);
        assert!(p.may_call("math::add").is_ok());
        assert!(p.may_call("anything").is_ok());
        for (id, prefix) in [
            ("sandbox-libkrun::list", "sandbox-libkrun::"),
            ("sandbox-libkrun::exec", "sandbox-libkrun::"),
            ("sandbox-bwrap::exec", "sandbox-bwrap::"),
            ("sandbox::run", "sandbox::"),
            ("configuration::get", "configuration::"),
            ("engine::functions::list", "engine::"),
        ] {
            assert_eq!(
                p.may_call(id),
                Err(Refusal::Reserved {
                    id: id.into(),
                    prefix: prefix.into()
                }),
                "{id}"
            );
        }
        let narrow = policy(&["math::*"], &["*"]);
        let refusal = narrow.may_call("shell::exec").unwrap_err();
        assert_eq!(refusal.rule(), "sandbox_bus_call");
        assert!(refusal.to_string().contains("`shell::exec`"), "{refusal}");
        assert!(
            refusal.to_string().contains("sandbox_bus_call"),
            "{refusal}"
        );
    }

    #[test]
    fn registrations_follow_their_list_and_never_take_reserved_ids() {
        let p = policy(&[], &["*"]);
        assert!(p.may_register("guest::hello").is_ok());
        for id in [
            "sandbox-libkrun::create",
            "sandbox::run",
            "configuration::get",
            "engine::workers::register",
            "engine::channels::create",
        ] {
            assert!(
                matches!(p.may_register(id), Err(Refusal::Reserved { .. })),
                "{id}"
            );
        }
        let narrow = policy(&[], &["guest::*"]);
        assert!(narrow.may_register("guest::hello").is_ok());
        assert_eq!(
            narrow.may_register("math::add").unwrap_err().rule(),
            "sandbox_bus_register"
        );
        let none = policy(&[], &[]);
        assert!(none.may_register("guest::hello").is_err());
    }

    #[test]
    fn no_guest_is_the_adapters_worker() {
        let p = policy(&[], &["*"]);
        assert!(p.may_name_worker("code-runner-guest").is_ok());
        assert!(matches!(
            p.may_name_worker("sandbox-libkrun"),
            Err(Refusal::AdapterWorkerName { .. })
        ));
        assert!(p.may_name_worker(" sandbox-libkrun ").is_err());
    }

    #[test]
    fn a_bad_pattern_names_its_key_and_entry() {
        let error = Policy::new(&strings(&["ok", ""]), &[], &[], &[]).unwrap_err();
        assert_eq!(error.key, CALL_KEY);
        assert_eq!(error.index, 1);
        assert!(Policy::check_list(REGISTER_KEY, &strings(&["a b"])).is_err());
    }
}
