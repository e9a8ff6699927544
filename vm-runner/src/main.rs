//! sandbox-libkrun-vm: boots one libkrun microVM described by a JSON specification and
//! exits with its workload's status. Not a manager of many VMs: see the `vm_runner` crate.
//!
//! Usage: `sandbox-libkrun-vm --spec PATH` (or `--spec -` for standard input), or
//! `sandbox-libkrun-vm --capture-layer PID UPPER INTO LIMIT` to copy a running sandbox's
//! writable layer for a snapshot (see `vm_runner::capture`).

use std::io::Read;
use std::process::ExitCode;

use vm_runner::exit::{BAD_SPEC, HOST_UNFIT};
#[cfg(target_os = "linux")]
use vm_runner::launch::{self, LaunchError};
use vm_runner::{SpecError, VmSpec};

const USAGE: &str = "usage: sandbox-libkrun-vm --spec PATH|-";

fn read_spec(source: &str) -> Result<VmSpec, SpecError> {
    let text = if source == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        text
    } else {
        std::fs::read_to_string(source)?
    };
    VmSpec::from_json(&text)
}

fn fail(code: i32, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("sandbox-libkrun-vm: {message}");
    ExitCode::from(code as u8)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    #[cfg(target_os = "linux")]
    if args.first().map(String::as_str) == Some("--capture-layer") {
        return ExitCode::from(vm_runner::capture::capture_layer(&args[1..]));
    }
    let source = match args.as_slice() {
        [flag, source] if flag == "--spec" => source.clone(),
        _ => return fail(BAD_SPEC, USAGE),
    };
    let spec = match read_spec(&source) {
        Ok(spec) => spec,
        Err(e) => return fail(BAD_SPEC, format_args!("bad specification: {e}")),
    };
    boot(&spec)
}

#[cfg(target_os = "linux")]
fn boot(spec: &VmSpec) -> ExitCode {
    use vm_runner::exit::VM_FAILED;
    if let Err(e) = launch::die_with_parent() {
        return fail(VM_FAILED, e);
    }
    match launch::boot(spec) {
        Ok(never) => match never {},
        Err(e @ LaunchError::HostUnfit(_)) => fail(HOST_UNFIT, e),
        Err(e) => fail(VM_FAILED, e),
    }
}

/// The runner is Linux-only: elsewhere a specification is read, then refused as the probe does.
#[cfg(not(target_os = "linux"))]
fn boot(_spec: &VmSpec) -> ExitCode {
    fail(HOST_UNFIT, vm_runner::HostUnfit::NotBuilt)
}
