//! Hands the target triple this build is compiled for to the code: `adapter::info` names it,
//! since the same adapter ships for several hosts and a caller (or an operator reading a log)
//! should not have to guess which archive was installed.

fn main() {
    let target = std::env::var("TARGET").expect("cargo sets TARGET for build scripts");
    println!("cargo:rustc-env=SANDBOX_TARGET={target}");
}
