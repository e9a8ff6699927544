//! Builds the two small static guest programs (the guest init shim, and a vsock helper for
//! the tests) with the system C compiler, the same way libkrun builds its own guest init.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
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
    println!("cargo:rerun-if-env-changed=CC");
}
