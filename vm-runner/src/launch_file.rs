//! The launch file read by the guest init shim (`guest/vm-init.c`).
//!
//! A list of NUL-terminated strings, so every argument and environment value reaches the
//! workload byte for byte (libkrun's kernel command line splits on spaces and quotes, and
//! its init's JSON reader mishandles `\u` escapes). The layout is documented in the C file.

use crate::spec::VmSpec;

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
    push("SVM1");
    push(&spec.shares.len().to_string());
    for share in &spec.shares {
        push(&share.tag);
        // Validation guarantees UTF-8 guest paths.
        push(&share.guest_path.to_string_lossy());
        push(if share.read_only { "ro" } else { "rw" });
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
        }
    }

    #[test]
    fn encodes_fields_in_the_documented_order() {
        let bytes = encode(&spec());
        let fields: Vec<&[u8]> = bytes.split(|b| *b == 0).collect();
        let expected: Vec<&[u8]> = vec![
            b"SVM1",
            b"1",
            b"data",
            b"/mnt/data",
            b"ro",
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
    fn krun_config_is_json_that_only_runs_the_shim() {
        let value: serde_json::Value = serde_json::from_str(&krun_init_config()).unwrap();
        assert_eq!(value["Cmd"], serde_json::json!([INIT_PATH]));
        assert_eq!(value["uid"], "0");
    }
}
