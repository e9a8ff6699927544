//! The launch file read by the guest init shim (`guest/vm-init.c`).
//!
//! A list of NUL-terminated strings, so every argument and environment value reaches the
//! workload byte for byte (libkrun's kernel command line splits on spaces and quotes, and
//! its init's JSON reader mishandles `\u` escapes). The layout is documented in the C file.

use crate::spec::{GuestMount, VmSpec, MOUNTS_GUEST_DIR, MOUNTS_TAG};

/// Guest path of the launch file (an overlay entry of the root virtio-fs device).
pub const LAUNCH_PATH: &str = "/.sandbox-vm-launch";
/// Guest path of the init shim (another overlay entry).
pub const INIT_PATH: &str = "/.sandbox-vm-init";
/// PATH given to the workload when the specification sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Encodes the launch file for a validated specification.
pub fn encode(spec: &VmSpec) -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |field: &str| {
        out.extend_from_slice(field.as_bytes());
        out.push(0);
    };
    push("SVM2");
    let binds = guest_layer_binds(spec);
    let mounts_share = binds.as_ref().map(|_| (MOUNTS_TAG, MOUNTS_GUEST_DIR, "rw"));
    let shares = spec.shares.iter().map(|share| {
        (
            share.tag.as_str(),
            // Validation guarantees UTF-8 guest paths.
            share.guest_path.to_str().unwrap_or_default(),
            if share.read_only { "ro" } else { "rw" },
        )
    });
    let shares: Vec<_> = shares.chain(mounts_share).collect();
    push(&shares.len().to_string());
    for (tag, guest_path, mode) in shares {
        push(tag);
        push(guest_path);
        push(mode);
    }
    push(if binds.is_some() { "1" } else { "0" });
    if let Some(binds) = binds {
        push(&binds.len().to_string());
        for bind in &binds {
            push(bind.kind);
            push(&bind.source);
            push(&bind.guest_path);
            push(if bind.read_only { "ro" } else { "rw" });
        }
    }
    push(spec.workdir.as_deref().unwrap_or("/"));
    push(&spec.workload);
    push(&spec.argv.len().to_string());
    for arg in &spec.argv {
        push(arg);
    }
    let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if !spec.env.contains_key("PATH") {
        env.push(format!("PATH={DEFAULT_PATH}"));
    }
    if !spec.env.contains_key("HOME") {
        env.push("HOME=/root".to_owned());
    }
    push(&env.len().to_string());
    for entry in &env {
        push(entry);
    }
    out
}

/// One mount the guest init makes again over its own overlay root (a guest disk layer).
#[derive(Debug, PartialEq, Eq)]
struct GuestBind {
    /// `root`: `source` is a path of the shared root (a share the init mounted, or a mount
    /// the runner made in the mounts share); `layer`: a directory of the guest disk, made if
    /// missing.
    kind: &'static str,
    source: String,
    guest_path: String,
    read_only: bool,
}

/// With a guest disk (`root_overlay.guest_disk`), what the guest init binds over its overlay
/// root: every share and every runner mount as it was (a symbolic link is a file of the root
/// and needs nothing), and each layer directory; none without one.
fn guest_layer_binds(spec: &VmSpec) -> Option<Vec<GuestBind>> {
    spec.root_overlay.as_ref()?.guest_disk.as_ref()?;
    let from_root = |source: String, path: &str, read_only: bool| GuestBind {
        kind: "root",
        source,
        guest_path: path.to_owned(),
        read_only,
    };
    let shares = spec.shares.iter().map(|s| {
        let path = s.guest_path.to_string_lossy();
        from_root(path.to_string(), &path, s.read_only)
    });
    let mounts = spec.mounts.iter().filter_map(|mount| match mount {
        GuestMount::Bind {
            guest_path,
            read_only,
            ..
        }
        | GuestMount::Tmpfs {
            guest_path,
            read_only,
        } => Some(from_root(
            format!("{MOUNTS_GUEST_DIR}{guest_path}"),
            guest_path,
            *read_only,
        )),
        GuestMount::Symlink { .. } => None,
        GuestMount::LayerDir { name, guest_path } => Some(GuestBind {
            kind: "layer",
            source: name.clone(),
            guest_path: guest_path.clone(),
            read_only: false,
        }),
    });
    Some(shares.chain(mounts).collect())
}

/// The configuration libkrun's own init reads: it only starts our shim. `uid`, `gid`,
/// `WorkingDir` and `Entrypoint` are set so that init's lenient JSON scan cannot pick them
/// up from anywhere else.
pub fn krun_init_config() -> String {
    format!(
        r#"{{"uid":"0","gid":"0","WorkingDir":"/","Entrypoint":[],"Env":[],"Cmd":["{INIT_PATH}"]}}"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn spec() -> VmSpec {
        VmSpec {
            vcpus: 1,
            memory_mib: 128,
            root: "/".into(),
            root_overlay: None,
            shares: vec![crate::spec::Share {
                tag: "data".into(),
                host_path: "/".into(),
                guest_path: "/mnt/data".into(),
                read_only: true,
            }],
            mounts: vec![],
            vsock: vec![],
            workload: "/bin/sh".into(),
            argv: vec!["-c".into(), "echo \"a b\" 'c'\n\u{1}".into()],
            env: BTreeMap::from([("A".into(), "x y".into()), ("PATH".into(), "/bin".into())]),
            workdir: None,
            console_log: None,
            console_fd: None,
            network: false,
            egress: None,
            nested_virt: false,
            virtiofs_shm_size_mib: 0,
            nofile_limit: None,
            runner_nofile: None,
            drop_root: None,
        }
    }

    #[test]
    fn encodes_fields_in_the_documented_order() {
        let bytes = encode(&spec());
        let fields: Vec<&[u8]> = bytes.split(|b| *b == 0).collect();
        let expected: Vec<&[u8]> = vec![
            b"SVM2",
            b"1",
            b"data",
            b"/mnt/data",
            b"ro",
            b"0",
            b"/",
            b"/bin/sh",
            b"2",
            b"-c",
            "echo \"a b\" 'c'\n\u{1}".as_bytes(),
            b"3",
            b"A=x y",
            b"PATH=/bin",
            b"HOME=/root",
            b"",
        ];
        assert_eq!(fields, expected);
    }

    #[test]
    fn a_guest_disk_lists_what_the_guest_binds_again_in_order() {
        let mut spec = spec();
        spec.root_overlay = Some(crate::spec::RootOverlay {
            lower: "/l".into(),
            layers: Vec::new(),
            upper: "/d/upper".into(),
            work: "/d/work".into(),
            size_mib: Some(8),
            image: None,
            guest_disk: Some("/d.img".into()),
        });
        spec.mounts = vec![
            GuestMount::Tmpfs {
                guest_path: "/worker".into(),
                read_only: true,
            },
            GuestMount::Bind {
                host_path: "/h/app".into(),
                guest_path: "/worker/app".into(),
                read_only: true,
            },
            GuestMount::Symlink {
                target: "app".into(),
                guest_path: "/worker/link".into(),
            },
            GuestMount::LayerDir {
                name: "state".into(),
                guest_path: "/state".into(),
            },
        ];
        let bytes = encode(&spec);
        let fields: Vec<&[u8]> = bytes.split(|b| *b == 0).collect();
        let expected: Vec<&[u8]> = vec![
            b"SVM2",
            b"2",
            b"data",
            b"/mnt/data",
            b"ro",
            b"iii-mounts",
            b"/.iii-mounts",
            b"rw",
            b"1",
            b"4",
            b"root",
            b"/mnt/data",
            b"/mnt/data",
            b"ro",
            b"root",
            b"/.iii-mounts/worker",
            b"/worker",
            b"ro",
            b"root",
            b"/.iii-mounts/worker/app",
            b"/worker/app",
            b"ro",
            b"layer",
            b"state",
            b"/state",
            b"rw",
            b"/",
        ];
        assert_eq!(fields[..expected.len()], expected[..]);
    }

    #[test]
    fn krun_config_is_json_that_only_runs_the_shim() {
        let value: serde_json::Value = serde_json::from_str(&krun_init_config()).unwrap();
        assert_eq!(value["Cmd"], serde_json::json!([INIT_PATH]));
        assert_eq!(value["uid"], "0");
    }
}
