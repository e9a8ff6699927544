//! Installed the way iii Compose installs a binary worker: the release archive is built
//! (`scripts/release.sh`, once per test process or once for all of `scripts/test.sh`), only
//! its `sandbox-libkrun` entry is extracted into an empty directory, and that one file serves
//! `print(6*7)` on the bwrap plugin by name, with nothing of ours on the PATH or next to it and
//! no helper variable set. Its embedded files land in
//! `$HOME/.iii/lib/sandbox-libkrun/<version>-<hash>/`: reused as they are by a second start,
//! replaced when tampered with.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use e2e_tests::{
    bwrap_usable, host_dir, repo_root, strip_ansi, AdapterOptions, InstalledBinary, Stack,
};
use serde_json::json;

const TARGET: &str = "x86_64-unknown-linux-gnu";
const ARCHIVE: &str = "sandbox-libkrun-x86_64-unknown-linux-gnu.tar.gz";
/// What the embedded directory holds, whatever the plugin asked for.
const EMBEDDED: [&str; 5] = [
    "libplugin_bwrap.so",
    "libplugin_libkrun.so",
    "sandbox-agent",
    "sandbox-bwrap-launch",
    "sandbox-libkrun-vm",
];
/// The PATH the installed adapter gets: the system's programs (bwrap, pasta), none of ours.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `scripts/release.sh` into a directory kept for the test process; `Err` (why) where
/// this host cannot make the x86_64 Linux archive. `SANDBOX_RELEASE_DIR` names a directory
/// that `scripts/release.sh` fills or already filled (`scripts/test.sh` builds it once, in the
/// background, for every pass and the VM lab).
fn release_archive() -> Result<&'static Path, String> {
    static ARCHIVE_DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ARCHIVE_DIR
        .get_or_init(|| {
            if let Some(dir) = std::env::var_os("SANDBOX_RELEASE_DIR") {
                let dir = PathBuf::from(dir);
                wait_for_background_build(&dir);
                return Ok(dir);
            }
            if std::env::consts::ARCH != "x86_64" || std::env::consts::OS != "linux" {
                return Err(format!("the release archive is built for {TARGET} only"));
            }
            remove_stale_archive_dirs();
            let dir = std::env::temp_dir().join(format!("{RELEASE_DIR}{}", std::process::id()));
            let started = Instant::now();
            let out = Command::new("bash")
                .arg(repo_root().join("scripts/release.sh"))
                .arg(&dir)
                .output()
                .expect("run scripts/release.sh");
            assert!(
                out.status.success(),
                "scripts/release.sh failed: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            println!(
                "scripts/release.sh took {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(dir)
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(Clone::clone)
}

const RELEASE_DIR: &str = "sandbox-libkrun-release-";

/// Where `scripts/test.sh` builds the archive in the background, `.lock` is held (flock) by
/// the build until it has ended and written its exit status to `.status`: a shared lock taken
/// here waits for exactly that. A directory without `.lock` was filled beforehand.
fn wait_for_background_build(dir: &Path) {
    use nix::fcntl::{Flock, FlockArg};
    let Ok(lock) = std::fs::File::open(dir.join(".lock")) else {
        return;
    };
    let started = Instant::now();
    let _held = Flock::lock(lock, FlockArg::LockShared).expect("flock the release build's lock");
    let status = std::fs::read_to_string(dir.join(".status")).unwrap_or_default();
    assert_eq!(
        status.trim(),
        "0",
        "scripts/release.sh, run by scripts/test.sh in the background, failed (status {:?}):\n{}",
        status.trim(),
        std::fs::read_to_string(dir.join(".log")).unwrap_or_default()
    );
    println!(
        "the release archive built in the background: waited {:.1} s for it",
        started.elapsed().as_secs_f64()
    );
}

/// The archive directories of earlier test processes (a static is never dropped): removed
/// once their process is gone.
fn remove_stale_archive_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(RELEASE_DIR)) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Extracts the entry named `sandbox-libkrun` (and nothing else) into a fresh, empty
/// directory the adapter's user owns, mode 0755: what iii's installer does.
fn install(archive_dir: &Path) -> (tempfile::TempDir, PathBuf) {
    let archive = archive_dir.join(ARCHIVE);
    let listing = run(Command::new("tar").arg("-tvzf").arg(&archive));
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 1, "one entry: {listing}");
    assert!(lines[0].starts_with("-rwxr-xr-x 0/0 "), "{listing}");
    assert!(lines[0].ends_with(" sandbox-libkrun"), "{listing}");
    // The checksum file is sha256sum's, naming the archive.
    run(Command::new("sha256sum")
        .arg("--check")
        .arg(format!("{ARCHIVE}.sha256"))
        .current_dir(archive_dir));

    let bin_dir = host_dir();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(bin_dir.path())
        .arg("sandbox-libkrun"));
    let binary = bin_dir.path().join("sandbox-libkrun");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let entries: Vec<_> = std::fs::read_dir(bin_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["sandbox-libkrun"]);
    (bin_dir, binary)
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run a command");
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn options(binary: &Path, home: &Path, worker_name: &str) -> AdapterOptions {
    options_for_plugin(binary, home, worker_name, "bwrap")
}

fn options_for_plugin(
    binary: &Path,
    home: &Path,
    worker_name: &str,
    plugin: &str,
) -> AdapterOptions {
    for dir in SYSTEM_PATH.split(':') {
        for name in ["sandbox-libkrun", "sandbox-agent", "sandbox-bwrap-launch"] {
            assert!(
                !Path::new(dir).join(name).exists(),
                "{dir}/{name} exists: the test would not show the binary is self-contained"
            );
        }
    }
    AdapterOptions {
        worker_name: worker_name.into(),
        env: vec![
            ("HOME".into(), home.display().to_string()),
            ("PATH".into(), SYSTEM_PATH.into()),
        ],
        installed: Some(InstalledBinary {
            binary: binary.to_path_buf(),
            plugin_arg: plugin.into(),
        }),
        ..AdapterOptions::default()
    }
}

async fn print_42(stack: &Stack) {
    let result = stack
        .call(
            "run",
            json!({"image": "python", "lang": "python", "code": "print(6*7)"}),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", stack.adapter.log()));
    assert_eq!(result["stdout"], "42\n", "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
}

/// The one `<version>-<hash>` directory under `$HOME/.iii/lib/sandbox-libkrun/`.
fn extracted_dir(home: &Path) -> PathBuf {
    let base = home.join(".iii/lib/sandbox-libkrun");
    let entries: Vec<String> = std::fs::read_dir(&base)
        .unwrap_or_else(|e| panic!("{}: {e}", base.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "one directory, no temporaries: {entries:?}"
    );
    let name = &entries[0];
    let version = env!("CARGO_PKG_VERSION");
    let hash = name
        .strip_prefix(&format!("{version}-"))
        .unwrap_or_else(|| panic!("{name} is not {version}-<hash>"));
    assert!(
        hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{name}"
    );
    let dir = base.join(name);
    assert_eq!(
        std::fs::metadata(&dir).unwrap().mode() & 0o7777,
        0o755,
        "{}",
        dir.display()
    );
    dir
}

/// (inode, mtime in ns) of each extracted file; checks that exactly the embedded files are
/// there, each an executable regular file.
fn identities(dir: &Path) -> BTreeMap<String, (u64, i128)> {
    let files: BTreeMap<String, (u64, i128)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            assert!(meta.is_file(), "{:?}", e.path());
            assert_eq!(meta.mode() & 0o7777, 0o755, "{:?}", e.path());
            let mtime = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
            (e.file_name().into_string().unwrap(), (meta.ino(), mtime))
        })
        .collect();
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        EMBEDDED,
        "{}",
        dir.display()
    );
    files
}

/// The numbers of the shell's `embedded files ready` log line (`first_use`, `replaced`,
/// `elapsed_ms`), the last one logged.
fn ready_line(log: &str) -> (bool, u64, u64) {
    let log = strip_ansi(log);
    let line = log
        .lines()
        .rfind(|l| l.contains("embedded files ready"))
        .unwrap_or_else(|| panic!("no `embedded files ready` line:\n{log}"));
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            .to_string()
    };
    (
        field("first_use") == "true",
        field("replaced").parse().unwrap(),
        field("elapsed_ms").parse().unwrap(),
    )
}

/// Whether a child of the adapter runs `program` (the bwrap plugin keeps a launcher waiting).
fn child_runs(adapter_pid: u32, program: &Path) -> bool {
    let children = std::fs::read_dir(format!("/proc/{adapter_pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().map(str::to_string).collect::<Vec<_>>());
    children
        .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).ok())
        .any(|exe| exe == program)
}

fn maps_contain(pid: u32, file: &Path) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.contains(&file.display().to_string()))
}

/// Overwrites the start of `path` in place (same inode, same size): only its hash tells.
fn tamper_in_place(path: &Path) {
    use std::io::{Seek, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(std::io::SeekFrom::Start(4096)).unwrap();
    file.write_all(b"tampered").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn installed_like_compose_it_serves_reuses_its_files_and_repairs_them() {
    if !bwrap_usable("installed_like_compose_it_serves_reuses_its_files_and_repairs_them") {
        return;
    }
    let archive_dir = match release_archive() {
        Ok(dir) => dir,
        Err(reason) => {
            println!("\n*** installed_like_compose DID NOT RUN: {reason} ***\n");
            return;
        }
    };
    let (_bin_dir, binary) = install(archive_dir);
    let size = std::fs::metadata(&binary).unwrap().len();
    let archive_size = std::fs::metadata(archive_dir.join(ARCHIVE)).unwrap().len();
    println!(
        "sandbox-libkrun: {:.1} MiB, {ARCHIVE}: {:.1} MiB",
        size as f64 / 1048576.0,
        archive_size as f64 / 1048576.0
    );
    let home = host_dir();

    // A bare name the build does not carry: refused before anything is written.
    let out = Command::new(&binary)
        .args(["--plugin", "nosuch"])
        .env_clear()
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no such embedded plugin (this build carries: bwrap, libkrun)"),
        "{stderr}"
    );
    assert!(!home.path().join(".iii").exists());

    // First start: the files are written, the plugin and its helpers come from there.
    let options = options(&binary, home.path(), "sandbox-libkrun");
    let started = Instant::now();
    let mut stack = Stack::start(json!({}), options.clone()).await;
    let first_start = started.elapsed();
    let (first_use, replaced, first_ms) = ready_line(&stack.adapter.log());
    assert!(first_use && replaced == 0, "{}", stack.adapter.log());
    let dir = extracted_dir(home.path());
    let before = identities(&dir);
    let pid = stack.adapter.pid();
    assert!(
        maps_contain(pid, &dir.join("libplugin_bwrap.so")),
        "the plugin is loaded from {}",
        dir.display()
    );
    print_42(&stack).await;
    let info = stack.call("adapter::info", json!({})).await.unwrap();
    assert_eq!(info["adapter_version"], env!("CARGO_PKG_VERSION"), "{info}");
    assert!(
        info["adapter_version"]
            .as_str()
            .unwrap()
            .starts_with("0.3."),
        "Compose pins ^0.3: {info}"
    );
    let launcher = dir.join("sandbox-bwrap-launch");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !child_runs(pid, &launcher) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        child_runs(pid, &launcher),
        "a launcher from {} waits",
        launcher.display()
    );

    // Second start: the same files, not rewritten.
    stack.adapter.terminate();
    let started = Instant::now();
    stack.restart_adapter(&options).await;
    let second_start = started.elapsed();
    let (first_use, replaced, second_ms) = ready_line(&stack.adapter.log());
    assert!(!first_use && replaced == 0, "{}", stack.adapter.log());
    assert_eq!(identities(&dir), before, "the second start rewrote files");
    print_42(&stack).await;

    // Tampered with while no adapter runs: the plugin in place (same size), the agent
    // replaced by a script. The next start rewrites both, keeps the others, and works.
    stack.adapter.terminate();
    let plugin = dir.join("libplugin_bwrap.so");
    let agent = dir.join("sandbox-agent");
    let plugin_bytes = std::fs::read(&plugin).unwrap();
    let agent_bytes = std::fs::read(&agent).unwrap();
    tamper_in_place(&plugin);
    std::fs::write(&agent, "#!/bin/sh\nexit 0\n").unwrap();
    stack.restart_adapter(&options).await;
    let log = strip_ansi(&stack.adapter.log());
    let (first_use, replaced, third_ms) = ready_line(&log);
    assert!(!first_use && replaced == 2, "{log}");
    for (file, why) in [(&plugin, "sha256 "), (&agent, " bytes, not ")] {
        assert!(
            log.lines().any(|l| l.contains("did not match this build")
                && l.contains(&file.display().to_string())
                && l.contains(why)),
            "{} reported as replaced ({why}):\n{log}",
            file.display()
        );
    }
    assert_eq!(std::fs::read(&plugin).unwrap(), plugin_bytes);
    assert_eq!(std::fs::read(&agent).unwrap(), agent_bytes);
    let after = identities(&dir);
    for (name, identity) in &before {
        let rewritten = name == "libplugin_bwrap.so" || name == "sandbox-agent";
        assert_eq!(
            after[name].0 != identity.0,
            rewritten,
            "{name}: {before:?} {after:?}"
        );
    }
    print_42(&stack).await;
    println!(
        "start to serving: first {:.0} ms (extraction {first_ms} ms), second {:.0} ms \
         (check {second_ms} ms), after tampering {third_ms} ms to check and rewrite",
        first_start.as_secs_f64() * 1000.0,
        second_start.as_secs_f64() * 1000.0,
    );
}

/// Two adapters starting at once over one HOME (each with its own engine): one writes the
/// directory, the other uses it; both serve and nothing temporary is left.
#[tokio::test(flavor = "multi_thread")]
async fn two_installed_adapters_starting_at_once_share_one_directory() {
    if !bwrap_usable("two_installed_adapters_starting_at_once_share_one_directory") {
        return;
    }
    let archive_dir = match release_archive() {
        Ok(dir) => dir,
        Err(reason) => {
            println!("\n*** two_installed_adapters DID NOT RUN: {reason} ***\n");
            return;
        }
    };
    let (_bin_dir, binary) = install(archive_dir);
    let home = host_dir();
    let (a, b) = tokio::join!(
        Stack::start(json!({}), options(&binary, home.path(), "sandbox-libkrun")),
        Stack::start(json!({}), options(&binary, home.path(), "sandbox-libkrun")),
    );
    let dir = extracted_dir(home.path());
    identities(&dir);
    let firsts = [&a, &b]
        .iter()
        .filter(|s| ready_line(&s.adapter.log()).0)
        .count();
    // Both may have found no directory: one rename wins, the other uses the winner's files.
    assert_eq!(firsts, 1, "{}\n{}", a.adapter.log(), b.adapter.log());
    for stack in [&a, &b] {
        assert_eq!(ready_line(&stack.adapter.log()).1, 0);
        print_42(stack).await;
    }
}

/// A build without embedded files (the workspace's own) says so for a bare plugin name, and
/// how to get one; it exits before reaching any engine.
#[test]
fn a_build_without_embedded_plugins_says_how_to_make_one() {
    let out = Command::new(e2e_tests::adapter_bin())
        .args(["--plugin", "bwrap"])
        .env_remove("SANDBOX_LIBKRUN_PLUGIN")
        .env("III_URL", "ws://127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("carries no embedded plugins") && stderr.contains("scripts/release.sh"),
        "{stderr}"
    );
}

/// The same install on the libkrun plugin by name: `print(6*7)` in a real microVM, with the
/// VM runner, the agent and the guest init all from the one extracted file. MicroVMs boot only
/// where KVM runs libkrun's guest kernel: `tests/vm-lab/libkrun-e2e.sh` runs this test in the
/// VM lab with `SANDBOX_EXPECT_MICROVMS=1` (a refusal there fails); elsewhere it says it did
/// not run.
#[tokio::test(flavor = "multi_thread")]
async fn installed_like_compose_it_boots_print_42_in_a_microvm() {
    let expected = std::env::var("SANDBOX_EXPECT_MICROVMS").is_ok_and(|v| v == "1");
    let archive_dir = match release_archive() {
        Ok(dir) => dir,
        Err(reason) => {
            assert!(!expected, "SANDBOX_EXPECT_MICROVMS=1 but: {reason}");
            println!("\n*** installed_like_compose (libkrun) DID NOT RUN: {reason} ***\n");
            return;
        }
    };
    let (_bin_dir, binary) = install(archive_dir);
    let home = host_dir();
    let options = options_for_plugin(&binary, home.path(), "sandbox-libkrun", "libkrun");
    let stack = Stack::start(json!({}), options).await;
    let info = stack.call("adapter::info", json!({})).await.unwrap();
    assert_eq!(info["backend"]["name"], "libkrun", "{info}");
    if info["backend"]["ready"] != true {
        let reason = &info["backend"]["reason"];
        assert!(
            !expected,
            "SANDBOX_EXPECT_MICROVMS=1 but libkrun refuses: {reason}"
        );
        println!(
            "\n*** installed_like_compose (libkrun) DID NOT RUN: this host cannot boot \
             microVMs: {reason} (tests/vm-lab/libkrun-e2e.sh runs it in the VM lab) ***\n"
        );
        return;
    }
    let dir = extracted_dir(home.path());
    assert!(
        maps_contain(stack.adapter.pid(), &dir.join("libplugin_libkrun.so")),
        "the libkrun plugin is loaded from {}",
        dir.display()
    );
    let started = Instant::now();
    print_42(&stack).await;
    println!(
        "installed (libkrun): run print(6*7) in a microVM took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The microVM is run by the extracted runner, not by anything of the workspace's.
    let created = stack
        .call("create", json!({"image": "python"}))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", stack.adapter.log()));
    let id = created["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();
    let runner = dir.join("sandbox-libkrun-vm");
    assert!(
        child_runs(stack.adapter.pid(), &runner),
        "a child of the adapter runs {}",
        runner.display()
    );
    stack
        .call("stop", json!({"sandbox_id": id}))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", stack.adapter.log()));
}
