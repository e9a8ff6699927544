//! Can this host boot a libkrun guest? A fast check made before any VM call.
//!
//! Our development and CI machines expose a `/dev/kvm` backed by PVM (`kvm_pvm`), which
//! cannot run libkrunfw's guest kernel: a boot there dies after seconds. Hardware KVM shows
//! up as `kvm_intel` or `kvm_amd`, so we refuse PVM-only hosts up front.

#[cfg(target_os = "linux")]
use std::path::{Path, PathBuf};

/// libkrun dlopens this soname.
pub const LIBKRUNFW: &str = "libkrunfw.so.5";

/// Why this host cannot boot a microVM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostUnfit {
    #[error("/dev/kvm does not exist: no KVM on this host")]
    NoKvmDevice,
    #[error("/dev/kvm cannot be opened read-write: {0}")]
    KvmNotAccessible(String),
    #[error(
        "/dev/kvm is PVM (kvm_pvm loaded, no kvm_intel/kvm_amd): it cannot run libkrun's guest kernel"
    )]
    PvmOnly,
    #[error("{LIBKRUNFW} not found in $HOME/.iii/lib nor in the system library directories")]
    NoLibkrunfw,
    /// Not Linux: the runner is Linux-only (README, "Hosts": what a macOS build needs).
    #[cfg(not(target_os = "linux"))]
    #[error("this host cannot boot microVMs: macOS support is not built yet")]
    NotBuilt,
}

/// Checks the host and returns `Ok` only when a microVM can boot here.
#[cfg(target_os = "linux")]
pub fn host_can_boot() -> Result<(), HostUnfit> {
    check_kvm(Path::new("/dev/kvm"))?;
    if pvm_only(&loaded_modules()) {
        return Err(HostUnfit::PvmOnly);
    }
    find_libkrunfw().map(|_| ())
}

/// No runner is built for this host yet: a fast refusal, as on a Linux host without KVM.
#[cfg(not(target_os = "linux"))]
pub fn host_can_boot() -> Result<(), HostUnfit> {
    Err(HostUnfit::NotBuilt)
}

#[cfg(target_os = "linux")]
fn check_kvm(device: &Path) -> Result<(), HostUnfit> {
    if !device.exists() {
        return Err(HostUnfit::NoKvmDevice);
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map(drop)
        .map_err(|e| HostUnfit::KvmNotAccessible(e.to_string()))
}

/// Kernel modules known loaded, from `/proc/modules` and `/sys/module` (either may be
/// missing or incomplete in containers).
#[cfg(target_os = "linux")]
fn loaded_modules() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_to_string("/proc/modules")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    if let Ok(entries) = std::fs::read_dir("/sys/module") {
        names.extend(
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned()),
        );
    }
    names
}

#[cfg(target_os = "linux")]
fn pvm_only(modules: &[String]) -> bool {
    let has = |name: &str| modules.iter().any(|m| m == name);
    has("kvm_pvm") && !has("kvm_intel") && !has("kvm_amd")
}

/// Where libkrunfw will be loaded from: `$HOME/.iii/lib/` first, then the system path.
#[cfg(target_os = "linux")]
pub fn find_libkrunfw() -> Result<PathBuf, HostUnfit> {
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".iii/lib"));
    let ld_path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let system = [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib64",
        "/usr/local/lib",
    ];
    home.into_iter()
        .chain(
            ld_path
                .split(':')
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        )
        .chain(system.iter().map(PathBuf::from))
        .map(|dir| dir.join(LIBKRUNFW))
        .find(|candidate| candidate.is_file())
        .ok_or(HostUnfit::NoLibkrunfw)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pvm_alone_is_unfit_hardware_kvm_is_not() {
        assert!(pvm_only(&names(&["kvm", "kvm_pvm"])));
        assert!(!pvm_only(&names(&["kvm", "kvm_pvm", "kvm_amd"])));
        assert!(!pvm_only(&names(&["kvm", "kvm_intel"])));
        assert!(!pvm_only(&names(&["kvm"])));
    }

    #[test]
    fn missing_device_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("kvm");
        assert_eq!(check_kvm(&missing), Err(HostUnfit::NoKvmDevice));
    }
}
