//! File watching (`fs::watch`): the agent watches a path of the guest with inotify and sends
//! what changed, in batches, until the host stops it or the watch cannot go on.
//!
//! Wire: `WatchStart` (host to agent, a [`WatchRequest`]) is answered by `WatchEvents`
//! batches ([`WatchBatch`]; the first one is empty and says the watch is in place) and ends
//! with exactly one `WatchEnd` ([`WatchEnd`], agent to host; after it no frame of that id
//! follows). The host acknowledges each batch it has passed on with `WatchAck` (a
//! [`crate::FlowAck`] counting batches); the agent keeps at most [`WATCH_WINDOW`] batches
//! unacknowledged and meanwhile coalesces and, past its bounded queue, drops events (an
//! [`WatchKind::Overflow`] event says so). `WatchStop` (host to agent, empty) ends the watch.
//! Only to an agent whose `Hello` lists [`FEATURE_FS_WATCH`].
//!
//! Paths in events are relative to the watched path (`""` is the watched path itself), `/`
//! separated, without `.` or `..` components; bytes that are not UTF-8 are written `\xNN`
//! (and a backslash `\\`). The host checks all of it again: the guest writes these names.

use serde::{Deserialize, Serialize};

use crate::fs::FsError;

/// The `Hello` feature of an agent that knows the `Watch*` frames. Hosts never send them to
/// an agent without it (an older agent would end the link at an unknown frame kind).
pub const FEATURE_FS_WATCH: &str = "fs_watch";

/// Watches one agent keeps at once; one more is refused (`Busy`). Each holds one inotify
/// instance and one thread of the sandbox: four leave most of the smallest per-sandbox share
/// the bwrap backend gives (9 instances, for an ordinary user's sandboxes) to programs.
pub const MAX_WATCHES: usize = 4;

/// Directories (an inotify watch each) the watches of one agent hold together at most, and
/// one watch at most (see [`WatchRequest::max_dirs`]); past it a watch sends
/// [`WatchKind::Limit`] (a watch that cannot hold even its own path is refused, S216).
pub const MAX_WATCH_DIRS: u32 = 8192;

/// Batches the agent sends ahead of the host's `WatchAck`s.
pub const WATCH_WINDOW: u64 = 4;

/// Events in one batch at most; the agent also keeps each batch's JSON under
/// [`MAX_BATCH_BYTES`].
pub const MAX_BATCH_EVENTS: usize = 512;

/// A batch's JSON size the agent stays under (the frame limit is larger).
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

/// Longest relative path in an event, in bytes as sent (escapes included). Longer ones are
/// not sent: the agent reports an overflow instead.
pub const MAX_EVENT_PATH: usize = 4096;

/// Payload of `WatchStart`, host to agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    /// An absolute path of the guest: a directory, or a file (watched alone). A symbolic link
    /// is refused (S212): the watch never follows one.
    pub path: String,
    /// Watch every directory below `path` too (never through a symbolic link), and the ones
    /// created later.
    pub recursive: bool,
    /// Directories to hold at most (1 to [`MAX_WATCH_DIRS`]); past it the agent sends a
    /// [`WatchKind::Limit`] event and watches no more new directories.
    pub max_dirs: u32,
}

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Created,
    Modified,
    Deleted,
    /// A rename. With both ends seen (one inotify cookie), `path` is the new name and `from`
    /// the old; a rename out of the watched tree has no `from` and `path` is the old name,
    /// one into it has `from` unset too and `path` the new name.
    Moved,
    /// Events were lost here (the kernel's queue or the agent's bound); `path` is empty.
    Overflow,
    /// The watch reached its directory limit; directories past it are not watched.
    Limit,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: WatchKind,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub is_dir: bool,
    /// The old name of a paired rename.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// Payload of `WatchEvents`, agent to host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchBatch {
    pub events: Vec<WatchEvent>,
    /// Directories (or the one file) watched now.
    #[serde(default)]
    pub watched: u32,
}

/// Payload of `WatchEnd`, agent to host: the watch is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEnd {
    /// Why it could not start or go on (not set when the host stopped it).
    #[serde(default)]
    pub error: Option<FsError>,
}

/// Writes a name's bytes as a string: UTF-8 as it is, each other byte (and `\`) escaped.
pub fn escape_name(bytes: &[u8], out: &mut String) {
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                push_escaping_backslash(text, out);
                return;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                // valid_up_to() marks a UTF-8 prefix.
                push_escaping_backslash(std::str::from_utf8(good).unwrap_or_default(), out);
                let skip = e.error_len().unwrap_or(bad.len()).max(1).min(bad.len());
                for byte in &bad[..skip] {
                    out.push_str(&format!("\\x{byte:02x}"));
                }
                rest = &bad[skip..];
            }
        }
    }
}

fn push_escaping_backslash(text: &str, out: &mut String) {
    for c in text.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_utf8_are_escaped() {
        let mut out = String::new();
        escape_name(b"a\xffb\\c\xe2\x82", &mut out);
        assert_eq!(out, "a\\xffb\\\\c\\xe2\\x82");
        let mut plain = String::new();
        escape_name("é.txt".as_bytes(), &mut plain);
        assert_eq!(plain, "é.txt");
    }

    #[test]
    fn events_round_trip_and_optional_fields_default() {
        let event = WatchEvent {
            kind: WatchKind::Moved,
            path: "b".into(),
            is_dir: false,
            from: Some("a".into()),
        };
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"moved","path":"b","is_dir":false,"from":"a"}"#
        );
        assert_eq!(serde_json::from_str::<WatchEvent>(&json).unwrap(), event);
        let overflow: WatchEvent = serde_json::from_str(r#"{"kind":"overflow"}"#).unwrap();
        assert_eq!(overflow.kind, WatchKind::Overflow);
        assert!(serde_json::from_str::<WatchEvent>(r#"{"kind":"exploded"}"#).is_err());
    }
}
