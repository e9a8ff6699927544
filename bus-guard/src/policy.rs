//! What a guest may do on the bus: the operator's lists (`sandbox_bus_call`,
//! `sandbox_bus_register`) under the rules no list can widen.
//!
//! Never, whatever the lists say: an id under the adapter's own prefix, the router's
//! `sandbox::`, `configuration::` or `engine::` (except [`SDK_ENGINE_CALLS`], which the
//! official SDKs make for their own working), a worker under the adapter's name (under any
//! variant of case, width, whitespace or invisible characters), a namespace but `default`.
//! Ids another worker holds are the engine's to refuse (`registrationrejected`), which the
//! relay passes on without naming the holder.
//!
//! A worker VM's policy ([`Policy::worker_vm`]) opens registrations and calls but for the
//! reserved prefixes and `engine::`, and may name the worker's own namespace.

use std::fmt;

use crate::name::{clean, fold, Kind};
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
    /// A worker announced under the adapter's own name (or a variant of it).
    AdapterWorkerName { name: String },
    /// One of the guard's bounds.
    Limit { what: String },
    /// One of the guard's rules on what a message may carry; `rule` is short and fixed.
    Rule { rule: &'static str, what: String },
}

impl Refusal {
    /// The rule, short, for the adapter's log (no payload, no id).
    pub fn rule(&self) -> String {
        match self {
            Refusal::Reserved { prefix, .. } => format!("reserved:{prefix}"),
            Refusal::NotListed { key, .. } => (*key).to_string(),
            Refusal::AdapterWorkerName { .. } => "adapter worker name".into(),
            Refusal::Limit { .. } => "limit".into(),
            Refusal::Rule { rule, .. } => (*rule).to_string(),
        }
    }

    pub(crate) fn rule_of(rule: &'static str, what: impl Into<String>) -> Refusal {
        Refusal::Rule {
            rule,
            what: what.into(),
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
                "refused by the sandbox bus guard: no guest may announce itself as worker `{name}`, which is (or reads as) the adapter's own name"
            ),
            Refusal::Limit { what } => write!(f, "refused by the sandbox bus guard: {what}"),
            Refusal::Rule { rule, what } => {
                write!(f, "refused by the sandbox bus guard ({rule}): {what}")
            }
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

/// Whom a policy guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A sandbox: registrations and calls as the operator's lists say.
    Sandbox,
    /// A worker VM (a Compose worker: a real worker, still hostile): registrations and
    /// calls open but for the reserved prefixes, triggers relayed.
    WorkerVm { http_functions: bool },
}

/// The rules of one adapter, shared by every sandbox's connections.
#[derive(Debug, Clone)]
pub struct Policy {
    call: Vec<Pattern>,
    register: Vec<Pattern>,
    /// `<adapter prefix>::` for each name the adapter's functions may be served under.
    adapter_prefixes: Vec<String>,
    /// The adapter's worker names, folded ([`crate::name`]): reserved under every variant.
    adapter_workers: Vec<String>,
    mode: Mode,
    /// Namespaces a guest may name besides the engine's `default` (NFC, visible).
    namespaces: Vec<String>,
}

/// The engine's namespace, the only one a sandbox acts in.
pub const DEFAULT_NAMESPACE: &str = "default";

fn adapter_names(
    adapter_prefixes: &[String],
    adapter_workers: &[String],
) -> (Vec<String>, Vec<String>) {
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
    let prefixes = names(adapter_prefixes)
        .into_iter()
        .map(|p| format!("{p}::"))
        .collect();
    let mut workers: Vec<String> = names(adapter_workers).iter().map(|n| fold(n)).collect();
    workers.sort();
    workers.dedup();
    (prefixes, workers)
}

impl Policy {
    /// A sandbox's policy: `call` and `register` as the configuration lists them;
    /// `adapter_prefixes` (without `::`) and `adapter_workers` are the adapter's own names,
    /// never a guest's.
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
        let (adapter_prefixes, adapter_workers) = adapter_names(adapter_prefixes, adapter_workers);
        Ok(Policy {
            call: patterns(CALL_KEY, call)?,
            register: patterns(REGISTER_KEY, register)?,
            adapter_prefixes,
            adapter_workers,
            mode: Mode::Sandbox,
            namespaces: Vec::new(),
        })
    }

    /// A worker VM's policy. Registrations: any id outside the reserved prefixes (the
    /// adapter's, [`RESERVED_PREFIXES`]). Calls: any id but `engine::` (except
    /// [`SDK_ENGINE_CALLS`], which the guard rebuilds), with no `${` placeholder in the data
    /// of a `configuration::` call (the engine would expand it from its own environment).
    /// Triggers and trigger types are relayed. HTTP-invoked functions only when
    /// `http_functions`, and never with `auth` (it names the engine's environment variables).
    /// Namespaces: `default` only, unless [`Policy::with_namespace`] adds the worker's own.
    pub fn worker_vm(
        adapter_prefixes: &[String],
        adapter_workers: &[String],
        http_functions: bool,
    ) -> Policy {
        let (adapter_prefixes, adapter_workers) = adapter_names(adapter_prefixes, adapter_workers);
        Policy {
            call: Vec::new(),
            register: Vec::new(),
            adapter_prefixes,
            adapter_workers,
            mode: Mode::WorkerVm { http_functions },
            namespaces: Vec::new(),
        }
    }

    /// This policy letting a guest name `namespace` too (a Compose worker's `III_NAMESPACE`,
    /// which its SDK puts in its announcement, calls and triggers). A blank name, or one with
    /// invisible characters, adds nothing.
    pub fn with_namespace(mut self, namespace: &str) -> Policy {
        if let Ok(namespace) = clean(namespace.trim(), Kind::Id) {
            if !self.namespaces.contains(&namespace) {
                self.namespaces.push(namespace);
            }
        }
        self
    }

    /// The checks every list passes before use (configuration validation).
    pub fn check_list(key: &'static str, list: &[String]) -> Result<(), PolicyError> {
        for (index, text) in list.iter().enumerate() {
            Pattern::new(text).map_err(|reason| PolicyError { key, index, reason })?;
        }
        Ok(())
    }

    /// Whether this is a worker VM's policy.
    pub fn is_worker_vm(&self) -> bool {
        matches!(self.mode, Mode::WorkerVm { .. })
    }

    /// Whether a guest may register HTTP-invoked functions (without `auth`).
    pub fn http_functions(&self) -> bool {
        matches!(
            self.mode,
            Mode::WorkerVm {
                http_functions: true
            }
        )
    }

    /// Whether a guest may invoke `id`.
    pub fn may_call(&self, id: &str) -> Result<(), Refusal> {
        if SDK_ENGINE_CALLS.contains(&id) {
            return Ok(());
        }
        match self.mode {
            Mode::Sandbox => {
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
            Mode::WorkerVm { .. } => {
                if starts_with_folded(id, "engine::") {
                    Err(Refusal::Reserved {
                        id: id.into(),
                        prefix: "engine::".into(),
                    })
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Whether a guest may register `id`, or bind a trigger to it (the SDKs' own calls
    /// included: nobody serves `engine::` but the engine).
    pub fn may_register(&self, id: &str) -> Result<(), Refusal> {
        self.reserved(id)?;
        match self.mode {
            Mode::WorkerVm { .. } => Ok(()),
            Mode::Sandbox if self.register.iter().any(|p| p.matches(id)) => Ok(()),
            Mode::Sandbox => Err(Refusal::NotListed {
                id: id.into(),
                key: REGISTER_KEY,
            }),
        }
    }

    /// Whether a guest may announce itself as worker `name` (NFC, checked by the caller):
    /// never the adapter's names, under any variant of case, width, whitespace or invisible
    /// characters.
    pub fn may_name_worker(&self, name: &str) -> Result<(), Refusal> {
        let folded = fold(name);
        if self.adapter_workers.contains(&folded) {
            return Err(Refusal::AdapterWorkerName { name: name.into() });
        }
        Ok(())
    }

    /// Whether a guest may name `namespace` (absent is the engine's default).
    pub fn may_use_namespace(&self, namespace: Option<&str>) -> Result<(), Refusal> {
        let Some(namespace) = namespace else {
            return Ok(());
        };
        // Exactly as given: the engine tells namespaces apart by their bytes.
        if namespace == DEFAULT_NAMESPACE || self.namespaces.iter().any(|n| n == namespace) {
            return Ok(());
        }
        Err(Refusal::rule_of(
            "namespace",
            format!("a {} acts in namespace `default` only", self.whom()),
        ))
    }

    pub(crate) fn whom(&self) -> &'static str {
        match self.mode {
            Mode::Sandbox => "sandbox",
            Mode::WorkerVm { .. } => "worker VM",
        }
    }

    fn reserved(&self, id: &str) -> Result<(), Refusal> {
        let prefix = self
            .adapter_prefixes
            .iter()
            .map(String::as_str)
            .chain(RESERVED_PREFIXES.iter().copied())
            .find(|prefix| starts_with_folded(id, prefix));
        match prefix {
            Some(prefix) => Err(Refusal::Reserved {
                id: id.into(),
                prefix: prefix.into(),
            }),
            None => Ok(()),
        }
    }
}

/// Whether `id` starts with `prefix` as written or in folded form (a fullwidth or upper-case
/// spelling of a reserved prefix is refused too: it reads as the reserved one).
fn starts_with_folded(id: &str, prefix: &str) -> bool {
    id.starts_with(prefix) || fold(id).starts_with(&fold(prefix))
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
    fn the_adapters_name_is_reserved_under_every_variant() {
        let p = policy(&[], &["*"]);
        for name in [
            "Sandbox-Libkrun",
            "\u{ff53}\u{ff41}\u{ff4e}\u{ff44}\u{ff42}\u{ff4f}\u{ff58}-libkrun",
            "sandbox-libkrun\u{7}",
            "sandbox\u{200b}-libkrun",
        ] {
            assert!(p.may_name_worker(name).is_err(), "{name:?}");
        }
        assert!(p.may_name_worker("sandbox-libkrun-guest").is_ok());
    }

    #[test]
    fn a_worker_vm_is_open_but_for_the_reserved_ids() {
        let p = Policy::worker_vm(
            &strings(&["sandbox-libkrun"]),
            &strings(&["sandbox-libkrun"]),
            false,
        );
        assert!(p.is_worker_vm() && !p.http_functions());
        assert!(p.may_register("orders::create").is_ok());
        for id in [
            "sandbox-libkrun::x",
            "sandbox::run",
            "configuration::x",
            "engine::x",
        ] {
            assert!(p.may_register(id).is_err(), "{id}");
        }
        for id in [
            "orders::create",
            "sandbox::run",
            "sandbox-libkrun::create",
            "configuration::get",
        ] {
            assert!(p.may_call(id).is_ok(), "{id}");
        }
        assert!(p.may_call("engine::workers::register").is_ok());
        assert!(p.may_call("engine::functions::list").is_err());
        assert!(p.may_name_worker("SANDBOX-LIBKRUN").is_err());
        assert!(p.may_use_namespace(Some("shop")).is_err());
        let p = p.with_namespace("shop");
        assert!(p.may_use_namespace(Some("shop")).is_ok());
        assert!(p.may_use_namespace(Some("default")).is_ok());
        assert!(p.may_use_namespace(None).is_ok());
        assert!(p.may_use_namespace(Some("SHOP")).is_err());
        assert!(p.may_use_namespace(Some("shop\u{200b}")).is_err());
        let sandbox = policy(&["*"], &["*"]);
        assert!(!sandbox.is_worker_vm());
        assert!(sandbox.may_use_namespace(Some("shop")).is_err());
    }

    #[test]
    fn a_bad_pattern_names_its_key_and_entry() {
        let error = Policy::new(&strings(&["ok", ""]), &[], &[], &[]).unwrap_err();
        assert_eq!(error.key, CALL_KEY);
        assert_eq!(error.index, 1);
        assert!(Policy::check_list(REGISTER_KEY, &strings(&["a b"])).is_err());
    }
}
