//! Helpers for the boot tests: a busybox guest root, running the runner with a deadline.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The runner under test; `VM_RUNNER_BIN` overrides it (the lab runs copies of the binaries).
pub fn runner() -> PathBuf {
    std::env::var_os("VM_RUNNER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_sandbox-libkrun-vm").into())
}

/// The static vsock helper built by the crate's build script; `VM_RUNNER_VSOCK_HELPER`
/// overrides it.
fn vsock_helper() -> PathBuf {
    std::env::var_os("VM_RUNNER_VSOCK_HELPER")
        .map(PathBuf::from)
        .unwrap_or_else(|| concat!(env!("OUT_DIR"), "/vsock-helper").into())
}
/// A guest that hangs (TCG in the lab is slow, but not this slow) is killed after this.
const VM_DEADLINE: Duration = Duration::from_secs(180);

/// What one runner process did.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    /// Console lines, without the blank ones.
    pub fn lines(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .filter(|l| !l.is_empty())
            .collect()
    }
}

/// A static busybox, needed to build the guest root.
pub fn static_busybox() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("busybox"))
        .find(|p| p.is_file())
}

/// A minimal guest root: busybox with its applets, the vsock helper, mount points.
pub fn busybox_root(dir: &Path, busybox: &Path) -> PathBuf {
    let root = dir.join("root");
    for sub in ["bin", "dev", "proc", "sys", "tmp", "mnt", "root", "etc"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    std::fs::copy(vsock_helper(), root.join("bin/vsock-helper")).unwrap();
    let list = Command::new(busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let link = root.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", link).unwrap();
        }
    }
    root
}

/// A spec with the test defaults (1 vCPU, 256 MiB, no network).
pub fn spec(root: &Path, workload: &str, argv: &[&str]) -> Value {
    json!({"vcpus": 1, "memory_mib": 256, "root": root, "workload": workload, "argv": argv})
}

/// How many times [`run`] boots a guest the lab lost once more.
const LAB_REBOOTS: usize = 2;
/// The pause before such a boot: the lab's resets come in bursts (both boots of one create, a
/// second apart, then none for minutes).
pub const REBOOT_PAUSE: Duration = Duration::from_secs(10);

/// Runs the runner on `spec`, killing it after the deadline. A guest that the VM lab lost
/// before its workload reported is booted again after a pause, up to [`LAB_REBOOTS`] times,
/// and the test's output says so: under the lab's emulated nested SVM (TCG) about one libkrun
/// boot in twenty ends in a triple fault (`KVM_EXIT_SHUTDOWN`, libkrun then exits 0 with the
/// vCPU's code) before the guest printed anything, and once in CI a guest that had entered the
/// VM printed nothing for the whole deadline. The last boot ending so fails the test, so a
/// hang of our own never passes.
pub fn run(dir: &Path, spec: &Value) -> Outcome {
    let mut outcome = run_once(dir, spec);
    for reboot in 1..=LAB_REBOOTS {
        let Some(what) = outcome.lab_lost_guest() else {
            return outcome;
        };
        eprintln!(
            "*** {what} after {:.2?}: booting it again in {REBOOT_PAUSE:?} (reboot {reboot} of at most {LAB_REBOOTS}) ***\nits runner's stderr: {}",
            outcome.elapsed,
            outcome.stderr.trim_end()
        );
        std::thread::sleep(REBOOT_PAUSE);
        undo_lost_boot(spec);
        outcome = run_once(dir, spec);
    }
    assert!(
        outcome.lab_lost_guest().is_none(),
        "the last boot ended the same way: {outcome:?}"
    );
    outcome
}

/// Undoes what a lost boot may have left that a boot again must not meet: the runner creates
/// each guest-listens socket and refuses a spec naming one that exists (the adapter removes it
/// before each boot), and a guest lost in its workload may have written the root overlay's
/// upper layer, which the test then checks.
fn undo_lost_boot(spec: &Value) {
    let bridges = spec["vsock"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for bridge in bridges {
        if bridge["direction"] == "guest-listens" {
            if let Some(socket) = bridge["socket"].as_str() {
                remove(Path::new(socket), |p| std::fs::remove_file(p));
            }
        }
    }
    // The work directory may stay: the overlay's mount empties it (its `work/work` is 000,
    // which an ordinary user could not even list).
    if let Some(upper) = spec["root_overlay"]["upper"].as_str().map(Path::new) {
        if upper.is_dir() {
            // The guest's directories may lack the owner's write bit; they are all ours.
            let writable = Command::new("chmod")
                .arg("-R")
                .arg("u+rwx")
                .arg(upper)
                .status();
            assert!(
                writable.is_ok_and(|s| s.success()),
                "chmod -R u+rwx {upper:?}"
            );
            remove(upper, |p| std::fs::remove_dir_all(p));
            std::fs::create_dir(upper).unwrap();
        }
    }
}

fn remove(path: &Path, how: fn(&Path) -> std::io::Result<()>) {
    match how(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("removing what the lost boot left, {}: {e}", path.display()),
    }
}

impl Outcome {
    /// libkrun's log when the vCPU shut down (a triple fault) with no exit status from the
    /// guest's init: `Received KVM_EXIT_SHUTDOWN`, then `using vcpu exit code` instead of
    /// `using vmm exit code` (the workload's).
    pub fn guest_reset(&self) -> bool {
        self.stderr.contains("Received KVM_EXIT_SHUTDOWN")
            && self.stderr.contains("using vcpu exit code")
            && !self.stderr.contains("using vmm exit code")
    }

    /// Killed at the deadline after the runner had entered the VM, with nothing on the
    /// guest's console: the guest never got to its workload. A runner stuck before the VM
    /// (its own set-up) does not count.
    pub fn silent_hang(&self) -> bool {
        self.code.is_none()
            && self.elapsed >= VM_DEADLINE
            && self.stderr.contains("sandbox-libkrun-vm: entering the VM")
            && self.lines().is_empty()
    }

    /// Why the lab lost this guest before its workload reported, if it did.
    fn lab_lost_guest(&self) -> Option<&'static str> {
        if self.guest_reset() {
            Some("the guest reset before its workload reported (KVM_EXIT_SHUTDOWN, nothing on its console)")
        } else if self.silent_hang() {
            Some("the guest printed nothing until the deadline")
        } else {
            None
        }
    }
}

fn run_once(dir: &Path, spec: &Value) -> Outcome {
    let spec_path = dir.join(format!("spec-{}.json", uuid()));
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let start = Instant::now();
    let mut child = Command::new(runner())
        .arg("--spec")
        .arg(&spec_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > VM_DEADLINE {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let outcome = Outcome {
        code: status.code(),
        stdout: String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned(),
        elapsed: start.elapsed(),
    };
    eprintln!(
        "runner: exit {:?} after {:.2?}\n--- stdout\n{}--- stderr\n{}---",
        outcome.code, outcome.elapsed, outcome.stdout, outcome.stderr
    );
    outcome
}

fn uuid() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
