//! What the adapter tells a waiting `sandbox-bwrap-launch` process: the one message of the
//! launcher protocol, sent on the launcher's stdin before the agent protocol starts there.
//!
//! Why a launcher at all: joining a cgroup costs an RCU grace period in the kernel (~8 ms
//! measured here, most of a sandbox's create time). A launcher is started ahead of the
//! create, joins a fresh cgroup and unshares its mount namespace while nothing waits for it;
//! the create then only sends this message, and the launcher mounts the sandbox's overlay
//! root and becomes bwrap.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Upper bound of one message: paths and bwrap's arguments, never file contents.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// The sandbox's log as the launcher's helpers name it: their stderr, inherited from the
/// launcher, whose stderr the adapter made a pipe into the log it keeps within its bound.
pub const LOG_IN_LAUNCHER: &str = "/proc/self/fd/2";

/// Where the launcher gathers, in its private mount namespace, the copies of what the
/// sandbox sees (idmapped for a root adapter; see the launcher's `stage`), so that the
/// guest's mountinfo names these paths, never the adapter's: its layer is at `STAGE/layer`.
/// An ordinary user's FUSE-disk worker VM stages only the files bwrap binds (the launcher's
/// `stage_files`).
pub const STAGE: &str = "/tmp";

/// Everything the launcher needs once the sandbox is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchCommand {
    /// Overlay directories: the image's read-only root, the sandbox's upper and work dirs,
    /// and where the merged root is mounted (in the launcher's private mount namespace).
    pub lower: String,
    /// Snapshot layers stacked read-only over `lower`, the top-most first (see
    /// the `layer-capture` crate); empty for a sandbox of the bare image.
    #[serde(default)]
    pub layers: Vec<String>,
    /// The sandbox's layer directory (holds upper, work and merged).
    pub layer: String,
    pub upper: String,
    pub work: String,
    pub merged: String,
    /// Where a helper of the launcher (pasta's starter) opens the sandbox's log: its own
    /// stderr, inherited from the launcher, which the adapter started as a pipe into the log
    /// (see [`LOG_IN_LAUNCHER`]).
    pub log: String,
    /// bwrap's path and arguments; it runs with an empty environment.
    pub bwrap: String,
    pub args: Vec<String>,
    /// Egress (`network: true`): the launcher makes the sandbox's network namespace itself.
    pub network: Option<crate::network::NetworkSetup>,
    /// The size-limited filesystem holding `upper` and `work`, mounted at `disk.at` before
    /// the overlay (see `disk.rs`); none: they are plain directories of the layer.
    #[serde(default)]
    pub disk: Option<crate::disk::Disk>,
    /// The sandbox's open-file limit and its share of the host's per-user counters, applied
    /// by the launcher in the sandbox's user namespace before the sandbox's processes start.
    pub ceilings: crate::ns_limits::Ceilings,
}

impl LaunchCommand {
    /// The message on the wire: a 4-byte big-endian length, then the JSON.
    pub fn encode(&self) -> io::Result<Vec<u8>> {
        let json = serde_json::to_vec(self).map_err(io::Error::other)?;
        if json.len() > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "launch command of {} bytes is over {MAX_MESSAGE}",
                    json.len()
                ),
            ));
        }
        let mut message = (json.len() as u32).to_be_bytes().to_vec();
        message.extend_from_slice(&json);
        Ok(message)
    }

    /// Reads exactly one message and nothing past it: what follows on the stream belongs to
    /// the agent, so `input` must not be a buffered reader.
    pub fn read_from(mut input: impl Read) -> io::Result<LaunchCommand> {
        let mut length = [0u8; 4];
        input.read_exact(&mut length)?;
        let length = u32::from_be_bytes(length) as usize;
        if length > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("launch command of {length} bytes is over {MAX_MESSAGE}"),
            ));
        }
        let mut json = vec![0u8; length];
        input.read_exact(&mut json)?;
        serde_json::from_slice(&json).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// `userxattr,lowerdir=..,upperdir=..,workdir=..`, refusing what overlayfs options
    /// cannot carry.
    pub fn overlay_options(&self) -> io::Result<String> {
        for dir in self
            .layers
            .iter()
            .chain([&self.lower, &self.upper, &self.work])
        {
            if dir.contains([',', ':', '\\', '\0']) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{dir} holds a character overlayfs options cannot carry (',', ':', '\\' or NUL)"),
                ));
            }
        }
        // Mounted by the sandbox's user namespace: overlay's own xattrs in `user.*`.
        let mut lower = String::new();
        for layer in &self.layers {
            lower.push_str(layer);
            lower.push(':');
        }
        lower.push_str(&self.lower);
        Ok(format!(
            "userxattr,lowerdir={lower},upperdir={},workdir={}",
            self.upper, self.work
        ))
    }
}

/// Writes one message (the adapter's side).
pub fn write_command(mut output: impl Write, command: &LaunchCommand) -> io::Result<()> {
    output.write_all(&command.encode()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> LaunchCommand {
        LaunchCommand {
            lower: "/cache/root".into(),
            layers: Vec::new(),
            layer: "/state/s".into(),
            upper: "/state/s/upper".into(),
            work: "/state/s/work".into(),
            merged: "/state/s/merged".into(),
            log: "/state/s/sandbox.log".into(),
            bwrap: "/usr/bin/bwrap".into(),
            args: vec!["--unshare-all".into(), "a b \"c\"".into()],
            network: None,
            disk: None,
            ceilings: crate::ns_limits::Ceilings {
                open_files_soft: 1024,
                open_files_hard: 4096,
                counters: [Some(16), Some(24_067), None, None],
            },
        }
    }

    #[test]
    fn a_message_is_read_back_and_nothing_past_it() {
        let mut stream = Vec::new();
        write_command(&mut stream, &command()).unwrap();
        stream.extend_from_slice(b"agent bytes");
        let mut input = io::Cursor::new(stream);
        assert_eq!(LaunchCommand::read_from(&mut input).unwrap(), command());
        let mut rest = String::new();
        input.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "agent bytes");
    }

    #[test]
    fn oversized_truncated_and_garbled_messages_are_errors() {
        let huge = (MAX_MESSAGE as u32 + 1).to_be_bytes();
        assert!(LaunchCommand::read_from(&huge[..]).is_err());
        let mut cut = command().encode().unwrap();
        cut.truncate(cut.len() - 3);
        assert!(LaunchCommand::read_from(&cut[..]).is_err());
        let mut garbled = 5u32.to_be_bytes().to_vec();
        garbled.extend_from_slice(b"{nope");
        assert!(LaunchCommand::read_from(&garbled[..]).is_err());
        assert!(LaunchCommand::read_from(&[0u8, 0][..]).is_err());
    }

    #[test]
    fn snapshot_layers_stack_over_the_image_top_most_first() {
        let mut c = command();
        c.layers = vec!["/snap/b".into(), "/snap/a".into()];
        assert_eq!(
            c.overlay_options().unwrap(),
            "userxattr,lowerdir=/snap/b:/snap/a:/cache/root,upperdir=/state/s/upper,workdir=/state/s/work"
        );
    }

    #[test]
    fn overlay_options_refuse_separators() {
        assert_eq!(
            command().overlay_options().unwrap(),
            "userxattr,lowerdir=/cache/root,upperdir=/state/s/upper,workdir=/state/s/work"
        );
        for bad in ["/a,b", "/a:b", "/a\\b"] {
            let mut c = command();
            c.upper = bad.into();
            assert!(c.overlay_options().is_err(), "{bad}");
            let mut c = command();
            c.layers = vec![bad.into()];
            assert!(c.overlay_options().is_err(), "{bad}");
        }
    }
}
