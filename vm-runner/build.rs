//! Builds the two small static guest programs (the guest init shim, and a vsock helper for
//! the tests) with the system C compiler, the same way libkrun builds its own guest init.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    // Only the Linux launcher (src/launch.rs) embeds them: a macOS build has no runner yet.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // The guest programs run in the guest, whose architecture is the target's: a cross build
    // names its C compiler the way the cc crate reads it (CC_<target>, TARGET_CC), before CC.
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let target_cc = format!("CC_{}", target.replace('-', "_"));
    let cc = [target_cc.as_str(), "TARGET_CC", "CC"]
        .iter()
        .find_map(|var| std::env::var(var).ok())
        .unwrap_or_else(|| "cc".to_owned());
    for name in ["vm-init", "vsock-helper"] {
        let source = PathBuf::from("guest").join(format!("{name}.c"));
        println!("cargo:rerun-if-changed={}", source.display());
        let status = Command::new(&cc)
            .args(["-O2", "-static", "-Wall", "-Werror", "-o"])
            .arg(out_dir.join(name))
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
        assert!(
            status.success(),
            "compiling {} failed: {status}",
            source.display()
        );
    }
    for var in [target_cc.as_str(), "TARGET_CC", "CC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
}
