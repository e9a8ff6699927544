//! The boot sequence against stand-in runners (this host may not boot microVMs; the real
//! runner is exercised in the VM lab by the end-to-end test `tests/e2e/tests/libkrun.rs`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::vm_spec::test_boot_spec;

fn script(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("fake-runner");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn error_text(result: Result<Booted, BootError>) -> String {
    match result {
        Ok(_) => panic!("boot succeeded"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn runner_failure_reports_the_status_and_the_log_tails() {
    let dir = tempfile::tempdir().unwrap();
    let spec = test_boot_spec(dir.path());
    let runner = script(
        dir.path(),
        r#"echo "sandbox-libkrun-vm: this host cannot boot microVMs: no /dev/kvm" >&2
echo "guest said goodbye" > "$(dirname "$2")/console.log"
exit 3"#,
    );
    let text = error_text(
        LibkrunBackend::with_runner(runner)
            .boot_vm(&spec, None)
            .await,
    );
    assert!(
        text.contains("exit 3: this host cannot boot microVMs"),
        "{text}"
    );
    assert!(
        text.contains("runner log tail: sandbox-libkrun-vm: this host"),
        "{text}"
    );
    assert!(
        text.contains("console log tail: guest said goodbye"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_runner_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let spec = test_boot_spec(dir.path());
    let backend = LibkrunBackend::with_runner(dir.path().join("nowhere"));
    let text = error_text(backend.boot_vm(&spec, None).await);
    assert!(
        text.contains("nowhere") && text.contains(RUNNER_ENV),
        "{text}"
    );
}

/// A stand-in runner that does what the guest agent does first: dial the bridged socket
/// named in the specification, then echo what it reads.
#[tokio::test(flavor = "multi_thread")]
async fn agent_connection_is_returned_and_kill_reaps_the_runner() {
    let Some(python) = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
    else {
        println!("*** agent_connection_is_returned... DID NOT RUN: needs python3 ***");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = test_boot_spec(dir.path());
    let runner = script(
        dir.path(),
        &format!(
            r#"exec {python} -c '
import json, socket, sys, time
spec = json.load(open(sys.argv[2]))
s = socket.socket(socket.AF_UNIX)
s.connect(spec["vsock"][0]["socket"])
s.sendall(json.dumps(spec["argv"]).encode() + b"\n")
s.sendall(s.recv(100))
time.sleep(600)
' "$@""#
        ),
    );
    let backend = LibkrunBackend::with_runner(runner);
    let mut booted = backend.boot_vm(&spec, None).await.unwrap();
    let expected = b"[\"--confine\", \"--vsock-port\", \"1024\"]\n";
    let mut line = vec![0u8; expected.len()];
    booted.reader.read_exact(&mut line).await.unwrap();
    assert_eq!(line, expected, "{}", String::from_utf8_lossy(&line));
    booted.writer.write_all(b"ping").await.unwrap();
    let mut echo = [0u8; 4];
    booted.reader.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"ping");
    assert!(
        !spec.layer_dir.join("agent.sock").exists(),
        "the socket is removed once the agent is in"
    );
    let pid = booted.process.pid().unwrap();
    assert!(booted.process.is_alive());
    booted.process.kill().await;
    assert!(!booted.process.is_alive());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the runner is killed and reaped"
    );
}

/// A worker VM's spec: its mounts reach the runner, and its persistent layer boots again
/// over what the first boot left (no "already exists" refusal): plain directories, or its
/// ext4 image (made once, of `disk_mb`), which a root adapter's runner mounts and an
/// ordinary user's VM gets as its disk.
#[tokio::test(flavor = "multi_thread")]
async fn worker_specs_reach_the_runner_and_boot_again_on_their_layer() {
    let mke2fs = layer_disk::find_mke2fs();
    if mke2fs.is_none() {
        println!("the image halves DID NOT RUN: no mke2fs on this host");
    }
    let with_images = mke2fs
        .iter()
        .flat_map(|m| [(Some(m.clone()), true), (Some(m.clone()), false)]);
    for (images, root) in [(None, true)].into_iter().chain(with_images) {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = test_boot_spec(dir.path());
        spec.persistent_layer = true;
        spec.mounts.push(sandbox_core::GuestMount::Tmpfs {
            guest: "/worker".into(),
            read_only: true,
        });
        // The stand-in runner cannot mount an image: it leaves its mark beside the spec.
        let runner = script(
            dir.path(),
            r#"cp "$2" "$(dirname "$2")/seen.json"; echo "booted" >> "$(dirname "$2")/boots"; exit 3"#,
        );
        let with_image = images.is_some();
        let backend = LibkrunBackend::with_runner(runner).with_mke2fs(images, root);
        let mut image_inode = None;
        for boot in 1..=2 {
            let text = error_text(backend.boot_vm(&spec, None).await);
            assert!(text.contains("exit 3"), "boot {boot}: {text}");
            let seen: serde_json::Value =
                serde_json::from_slice(&std::fs::read(spec.layer_dir.join("seen.json")).unwrap())
                    .unwrap();
            assert_eq!(
                seen["mounts"],
                serde_json::json!([{"kind": "tmpfs", "guest_path": "/worker", "read_only": true}])
            );
            let overlay = &seen["root_overlay"];
            // A guest disk's runner holds only mount points on the host: a small tmpfs.
            let host_tmpfs =
                (with_image && !root).then_some(crate::vm_spec::GUEST_DISK_HOST_TMPFS_MIB);
            assert_eq!(overlay["size_mib"], serde_json::json!(host_tmpfs));
            if with_image {
                let image = spec.layer_dir.join("disk.img");
                let (mounted, other) = if root {
                    ("image", "guest_disk")
                } else {
                    ("guest_disk", "image")
                };
                assert_eq!(overlay[mounted], serde_json::json!(image), "root {root}");
                assert_eq!(overlay[other], serde_json::Value::Null);
                assert_eq!(
                    overlay["upper"],
                    serde_json::json!(spec.layer_dir.join("disk/upper"))
                );
                let meta = std::fs::symlink_metadata(&image).unwrap();
                assert!(meta.is_file());
                assert_eq!(meta.len(), u64::from(spec.disk_mb) << 20);
                use std::os::unix::fs::MetadataExt;
                let inode = *image_inode.get_or_insert(meta.ino());
                assert_eq!(
                    inode,
                    meta.ino(),
                    "boot {boot}: the image is kept, not made again"
                );
            } else {
                assert_eq!(overlay["image"], serde_json::Value::Null);
                assert_eq!(
                    overlay["upper"],
                    serde_json::json!(spec.layer_dir.join("upper"))
                );
                assert!(spec.layer_dir.join("upper").is_dir(), "boot {boot}");
            }
        }
        let boots = std::fs::read_to_string(spec.layer_dir.join("boots")).unwrap();
        assert_eq!(boots, "booted\nbooted\n");
    }
}

#[test]
fn a_vm_that_ended_without_a_guest_status_says_so_in_the_death_cause() {
    let layer = tempfile::tempdir().unwrap();
    let backend = LibkrunBackend::with_runner(layer.path().join("unused"));
    assert_eq!(
        backend.death_note(layer.path()),
        "",
        "no log: nothing to add"
    );
    std::fs::write(
        layer.path().join("runner.log"),
        "[krun_vmm] Received KVM_EXIT_SHUTDOWN\n[krun_vmm] using vcpu exit code: 0\n",
    )
    .unwrap();
    std::fs::write(
        layer.path().join("console.log"),
        "Kernel panic - not syncing\n",
    )
    .unwrap();
    let note = backend.death_note(layer.path());
    assert!(note.contains("without a status from the guest"), "{note}");
    assert!(
        note.contains("runner log tail: [krun_vmm] Received KVM_EXIT_SHUTDOWN"),
        "{note}"
    );
    assert!(note.contains("console log tail: Kernel panic"), "{note}");
}

#[test]
fn network_is_given_behind_the_policy_or_refused_never_the_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let spec = BootSpec {
        network: true,
        ..test_boot_spec(dir.path())
    };
    let mut backend = LibkrunBackend::with_runner(dir.path().join("runner"));
    backend.egress_tools = HostTools {
        pasta: Some("/usr/bin/pasta".into()),
        nft: Some("/usr/sbin/nft".into()),
        host_addrs: vec!["192.0.2.1".parse().unwrap()],
    };
    if backend.egress_tools.unavailable().is_none() {
        let setup = backend
            .egress_for(&spec)
            .unwrap()
            .expect("a sandbox's egress");
        assert!(setup.rules.contains("192.0.2.1"), "{}", setup.rules);
        assert_eq!(
            setup.run_as.is_some(),
            nix::unistd::geteuid().is_root(),
            "pasta runs as the subordinate ids exactly when the runner is root"
        );
    }
    backend.egress_tools = HostTools::default();
    let refused = backend.egress_for(&spec).unwrap_err().to_string();
    assert!(refused.contains("pasta"), "{refused}");
    assert!(refused.contains("never falls back"), "{refused}");
    let plain = BootSpec {
        network: false,
        ..test_boot_spec(dir.path())
    };
    assert!(backend.egress_for(&plain).unwrap().is_none());
    let worker = BootSpec {
        persistent_layer: true,
        snapshot_layers: Vec::new(),
        ..spec
    };
    assert!(
        backend.egress_for(&worker).is_err(),
        "without pasta a worker VM gets no way out either"
    );
}

#[test]
fn a_worker_vms_bus_is_pastas_one_forwarded_port_behind_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = LibkrunBackend::with_runner(dir.path().join("runner"));
    backend.egress_tools = HostTools {
        pasta: Some("/usr/bin/pasta".into()),
        nft: Some("/usr/sbin/nft".into()),
        host_addrs: vec!["192.0.2.1".parse().unwrap()],
    };
    let mut worker = BootSpec {
        network: true,
        persistent_layer: true,
        snapshot_layers: Vec::new(),
        ..test_boot_spec(dir.path())
    };
    worker.egress.bus = None;
    let refused = backend.egress_for(&worker).unwrap_err().to_string();
    assert!(refused.contains("III_URL"), "{refused}");
    if let Some(why) = backend.egress_tools.unavailable() {
        println!("the worker VM's egress set-up checks DID NOT RUN: {why}");
        return;
    }

    // The engine on the host's loopback: its port, and no other, forwarded into the
    // runner's namespace, where TSI makes the guest's connection to it the runner's.
    worker.egress.bus = Some("127.0.0.1:49134".parse().unwrap());
    let setup = backend.egress_for(&worker).unwrap().expect("egress");
    assert_eq!(setup.forwarded_ports, vec![49134]);
    let tcp_ns = setup.pasta_args.iter().position(|a| a == "--tcp-ns");
    assert_eq!(
        tcp_ns.map(|i| setup.pasta_args[i + 1].as_str()),
        Some("49134")
    );
    // An engine on another host: no forward, one accept rule for its address and port.
    worker.egress.bus = Some("192.0.2.7:49134".parse().unwrap());
    let setup = backend.egress_for(&worker).unwrap().expect("egress");
    assert!(setup.forwarded_ports.is_empty());
    assert!(
        setup.rules.contains("192.0.2.7 tcp dport 49134 accept"),
        "{}",
        setup.rules
    );
}
