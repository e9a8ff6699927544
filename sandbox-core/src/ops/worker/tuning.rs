//! The four `III_VM_*` variables (SPEC.md section 3): VM tuning for worker VMs only, read
//! once from the adapter's environment with upstream iii 0.25's parsing (`apply_vm_tuning_env`):
//! the two switches are on for `1`, `true`, `on` or `yes` in any case and off for anything
//! else; the numbers are decimal integers, and a value that does not parse is ignored (and
//! logged), leaving the default. Sandboxes never get them.
//!
//! What a backend can honour differs: [`VmTuning::status`] says what is in force for a
//! worker VM on it and why the rest is not.

use std::ffi::OsString;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

pub const HYPERTHREADING_ENV: &str = "III_VM_HYPERTHREADING";
pub const NESTED_VIRT_ENV: &str = "III_VM_NESTED_VIRT";
pub const VIRTIOFS_SHM_SIZE_ENV: &str = "III_VM_VIRTIOFS_SHM_SIZE_MIB";
pub const NOFILE_LIMIT_ENV: &str = "III_VM_NOFILE_LIMIT";
/// The guest's open-file limit when `III_VM_NOFILE_LIMIT` is unset (upstream's default).
pub const DEFAULT_NOFILE_LIMIT: u64 = 65536;
/// Linux's default `fs.nr_open`: a higher hard limit is refused by the guest kernel.
pub const GUEST_NR_OPEN: u64 = 1 << 20;

/// What a backend makes of a worker VM's tuning (`Backend::worker_tuning`): each backend
/// says it of itself, [`VmTuning::status`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TuningSupport {
    /// A microVM: every knob applies but SMT, which `no_smt` explains.
    MicroVm { no_smt: &'static str },
    /// No VM: the worker shares the host's CPUs and kernel; `nofile` says what open-file
    /// limit its processes get instead of the one asked for.
    NoVm { nofile: &'static str },
}

/// The tuning asked for by the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmTuning {
    /// SMT in the guest (`III_VM_HYPERTHREADING`).
    pub hyperthreading: bool,
    /// Nested virtualisation: VMX/SVM offered to the guest (`III_VM_NESTED_VIRT`).
    pub nested_virt: bool,
    /// DAX window of each virtio-fs share but the root, MiB; 0: none
    /// (`III_VM_VIRTIOFS_SHM_SIZE_MIB`).
    pub virtiofs_shm_size_mib: u32,
    /// `RLIMIT_NOFILE` (soft and hard) of the guest's init and so of everything it starts;
    /// `None` leaves it to the guest init (`III_VM_NOFILE_LIMIT=0`).
    pub nofile_limit: Option<u64>,
}

impl Default for VmTuning {
    fn default() -> Self {
        Self {
            hyperthreading: false,
            nested_virt: false,
            virtiofs_shm_size_mib: 0,
            nofile_limit: Some(DEFAULT_NOFILE_LIMIT),
        }
    }
}

impl VmTuning {
    /// The process's tuning, read from its environment the first time it is asked for (at
    /// start-up: the backend and the worker VMs both ask then) and kept.
    pub fn get() -> VmTuning {
        static TUNING: OnceLock<VmTuning> = OnceLock::new();
        *TUNING.get_or_init(|| {
            let (tuning, problems) = Self::from_vars(|name| std::env::var_os(name));
            for problem in problems {
                tracing::warn!("{problem}");
            }
            if tuning != VmTuning::default() {
                tracing::info!(?tuning, "VM tuning for worker VMs");
            }
            tuning
        })
    }

    /// Parses the variables `var` gives; the second part says which values were ignored
    /// (or will not do what they say) and why. Values are never echoed beyond 32 bytes.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> (VmTuning, Vec<String>) {
        let mut tuning = VmTuning::default();
        let mut problems = Vec::new();
        let text = |name: &str| var(name).map(|v| v.to_string_lossy().into_owned());
        let switch = |name: &str, problems: &mut Vec<String>| match text(name) {
            None => false,
            Some(value) => {
                let lower = value.to_ascii_lowercase();
                let on = matches!(lower.as_str(), "1" | "true" | "on" | "yes");
                if !on && !matches!(lower.as_str(), "" | "0" | "false" | "off" | "no") {
                    problems.push(format!(
                        "{name}={} is not 1, true, on or yes: taken as off",
                        shown(&value)
                    ));
                }
                on
            }
        };
        tuning.hyperthreading = switch(HYPERTHREADING_ENV, &mut problems);
        tuning.nested_virt = switch(NESTED_VIRT_ENV, &mut problems);
        if let Some(value) = text(VIRTIOFS_SHM_SIZE_ENV) {
            match value.parse::<u32>() {
                Ok(mib) => tuning.virtiofs_shm_size_mib = mib,
                Err(_) => problems.push(format!(
                    "{VIRTIOFS_SHM_SIZE_ENV}={} ignored: not a number of MiB (no window)",
                    shown(&value)
                )),
            }
        }
        if let Some(value) = text(NOFILE_LIMIT_ENV) {
            match value.parse::<u64>() {
                Ok(0) => tuning.nofile_limit = None,
                Ok(limit) => {
                    tuning.nofile_limit = Some(limit);
                    if limit > GUEST_NR_OPEN {
                        problems.push(format!(
                            "{NOFILE_LIMIT_ENV}={limit} is above the guest kernel's fs.nr_open \
                             ({GUEST_NR_OPEN}): the guest init will fail to set it and keep \
                             the kernel's default"
                        ));
                    }
                }
                Err(_) => problems.push(format!(
                    "{NOFILE_LIMIT_ENV}={} ignored: not a number (the default {DEFAULT_NOFILE_LIMIT} applies)",
                    shown(&value)
                )),
            }
        }
        (tuning, problems)
    }

    /// `worker::status`'s `vm_tuning`: what the environment asked for (`requested`), what
    /// a worker VM on `backend` gets (`applied`, as `support` says), and why each request it
    /// cannot honour is not (`not_applied`).
    pub fn status(&self, backend: &str, support: TuningSupport) -> Value {
        let requested = json!({
            "hyperthreading": self.hyperthreading,
            "nested_virt": self.nested_virt,
            "virtiofs_shm_size_mib": self.virtiofs_shm_size_mib,
            "nofile_limit": self.nofile_limit,
        });
        let mut applied = Map::new();
        let mut not_applied = Map::new();
        match support {
            TuningSupport::MicroVm { no_smt } => {
                applied.insert("hyperthreading".into(), false.into());
                if self.hyperthreading {
                    not_applied.insert("hyperthreading".into(), no_smt.into());
                }
                applied.insert("nested_virt".into(), self.nested_virt.into());
                applied.insert(
                    "virtiofs_shm_size_mib".into(),
                    self.virtiofs_shm_size_mib.into(),
                );
                applied.insert("nofile_limit".into(), json!(self.nofile_limit));
            }
            TuningSupport::NoVm { nofile } => {
                let no_vm =
                format!("the {backend} backend runs no VM: the worker shares the host's CPUs and kernel");
                let unmet = [
                ("hyperthreading", self.hyperthreading, no_vm.clone()),
                ("nested_virt", self.nested_virt, no_vm),
                (
                    "virtiofs_shm_size_mib",
                    self.virtiofs_shm_size_mib > 0,
                    format!("the {backend} backend runs no VM: /worker is a bind mount, not virtio-fs"),
                ),
                ("nofile_limit", self.nofile_limit.is_some(), nofile.to_string()),
            ];
                for (name, asked, reason) in unmet {
                    if asked {
                        not_applied.insert(name.into(), reason.into());
                    }
                }
            }
        }
        json!({
            "backend": backend,
            "requested": requested,
            "applied": applied,
            "not_applied": not_applied,
        })
    }
}

/// A value as shown in a message: at most 32 bytes of it.
pub fn shown(value: &str) -> String {
    let mut end = value.len().min(32);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < value.len() { "..." } else { "" };
    format!("{:?}{cut}", &value[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> (VmTuning, Vec<String>) {
        VmTuning::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn unset_means_upstreams_defaults() {
        let (tuning, problems) = parse(&[]);
        assert_eq!(tuning, VmTuning::default());
        assert_eq!(tuning.nofile_limit, Some(65536));
        assert!(!tuning.hyperthreading && !tuning.nested_virt);
        assert_eq!(tuning.virtiofs_shm_size_mib, 0);
        assert!(problems.is_empty());
    }

    #[test]
    fn switches_are_on_for_1_true_on_yes_in_any_case_and_off_otherwise() {
        for on in ["1", "true", "TRUE", "True", "on", "On", "yes", "YES"] {
            let (tuning, problems) = parse(&[(HYPERTHREADING_ENV, on), (NESTED_VIRT_ENV, on)]);
            assert!(tuning.hyperthreading && tuning.nested_virt, "{on}");
            assert!(problems.is_empty(), "{on}: {problems:?}");
        }
        for off in ["0", "false", "off", "no", "NO", ""] {
            let (tuning, problems) = parse(&[(HYPERTHREADING_ENV, off), (NESTED_VIRT_ENV, off)]);
            assert!(!tuning.hyperthreading && !tuning.nested_virt, "{off}");
            assert!(problems.is_empty(), "{off}: {problems:?}");
        }
        for odd in ["2", "y", "enabled", " 1", "1 "] {
            let (tuning, problems) = parse(&[(NESTED_VIRT_ENV, odd)]);
            assert!(!tuning.nested_virt, "{odd:?}");
            assert_eq!(problems.len(), 1, "{odd:?}");
            assert!(problems[0].contains(NESTED_VIRT_ENV), "{problems:?}");
        }
    }

    #[test]
    fn numbers_parse_and_bad_values_are_ignored_with_a_reason() {
        let (tuning, problems) =
            parse(&[(VIRTIOFS_SHM_SIZE_ENV, "256"), (NOFILE_LIMIT_ENV, "1024")]);
        assert_eq!(tuning.virtiofs_shm_size_mib, 256);
        assert_eq!(tuning.nofile_limit, Some(1024));
        assert!(problems.is_empty());

        let (tuning, _) = parse(&[(VIRTIOFS_SHM_SIZE_ENV, "0"), (NOFILE_LIMIT_ENV, "0")]);
        assert_eq!(tuning.virtiofs_shm_size_mib, 0);
        assert_eq!(tuning.nofile_limit, None, "0 leaves it to the guest init");

        for bad in ["-1", "1.5", "64k", "", " 64", "99999999999999999999999"] {
            let (tuning, problems) =
                parse(&[(VIRTIOFS_SHM_SIZE_ENV, bad), (NOFILE_LIMIT_ENV, bad)]);
            assert_eq!(tuning, VmTuning::default(), "{bad:?}");
            assert_eq!(problems.len(), 2, "{bad:?}: {problems:?}");
        }
        let (tuning, problems) = parse(&[(NOFILE_LIMIT_ENV, "2000000")]);
        assert_eq!(tuning.nofile_limit, Some(2_000_000));
        assert!(problems[0].contains("nr_open"), "{problems:?}");
        let (_, problems) = parse(&[(VIRTIOFS_SHM_SIZE_ENV, &"x".repeat(100))]);
        assert!(problems[0].len() < 120, "{problems:?}");
    }

    #[test]
    fn status_says_what_each_backend_applies() {
        let tuning = VmTuning {
            hyperthreading: true,
            nested_virt: true,
            virtiofs_shm_size_mib: 128,
            nofile_limit: Some(4096),
        };
        let microvm = TuningSupport::MicroVm {
            no_smt: "krun_set_vm_config sets no SMT",
        };
        let no_vm = TuningSupport::NoVm {
            nofile: "not applied: 65536 from the launcher",
        };
        let libkrun = tuning.status("libkrun", microvm);
        assert_eq!(
            libkrun["applied"],
            json!({"hyperthreading": false, "nested_virt": true,
                   "virtiofs_shm_size_mib": 128, "nofile_limit": 4096})
        );
        assert_eq!(libkrun["requested"]["hyperthreading"], true);
        let reason = libkrun["not_applied"]["hyperthreading"].as_str().unwrap();
        assert!(reason.contains("krun_set_vm_config"), "{reason}");
        assert_eq!(libkrun["not_applied"].as_object().unwrap().len(), 1);

        let bwrap = tuning.status("bwrap", no_vm);
        assert_eq!(bwrap["applied"], json!({}));
        assert_eq!(bwrap["not_applied"].as_object().unwrap().len(), 4);
        assert_eq!(
            bwrap["not_applied"]["nested_virt"],
            "the bwrap backend runs no VM: the worker shares the host's CPUs and kernel"
        );
        assert_eq!(
            bwrap["not_applied"]["nofile_limit"],
            "not applied: 65536 from the launcher"
        );

        let quiet = VmTuning {
            nofile_limit: None,
            ..VmTuning::default()
        };
        assert_eq!(quiet.status("bwrap", no_vm)["not_applied"], json!({}));
        assert_eq!(
            quiet.status("libkrun", microvm)["applied"]["nofile_limit"],
            Value::Null
        );
    }
}
