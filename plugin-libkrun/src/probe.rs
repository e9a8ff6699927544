//! Can this host boot libkrun's guest kernel? Answered fast, from files only.

use std::path::Path;

use sandbox_core::HostUnfit;

pub fn host_can_boot() -> Result<(), HostUnfit> {
    let kvm = Path::new("/dev/kvm");
    if !kvm.exists() {
        return Err(HostUnfit(
            "/dev/kvm does not exist: KVM is not available on this host".into(),
        ));
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(kvm)
        .is_err()
    {
        return Err(HostUnfit(
            "/dev/kvm is not readable and writable by this user".into(),
        ));
    }
    let hardware = ["kvm_intel", "kvm_amd"]
        .iter()
        .any(|m| Path::new("/sys/module").join(m).exists());
    if !hardware {
        let pvm = Path::new("/sys/module/kvm_pvm").exists();
        return Err(HostUnfit(if pvm {
            "/dev/kvm is PVM (software nested virtualisation), which cannot run libkrun's guest kernel".into()
        } else {
            "no hardware KVM module (kvm_intel or kvm_amd) is loaded".into()
        }));
    }
    Ok(())
}
