//! Byte channels: `engine::channels::create` makes one, and its two ends are WebSockets at
//! `/ws/channels/<id>?key=<access key>&dir=read|write`. Frames flow writer -> reader through
//! a bounded queue; the writer closing (or dropping) ends the reader's stream.

use std::collections::HashMap;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// Default and largest queue length, in frames.
const DEFAULT_BUFFER: usize = 64;
const MAX_BUFFER: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

impl Direction {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            _ => None,
        }
    }
}

/// The end a socket attached to.
pub enum ChannelEnd {
    Reader(mpsc::Receiver<Message>),
    Writer(mpsc::Sender<Message>),
    /// That end was already taken by another socket.
    Taken,
}

struct Slot {
    writer_key: String,
    reader_key: String,
    tx: Option<mpsc::Sender<Message>>,
    rx: Option<mpsc::Receiver<Message>>,
}

#[derive(Default)]
pub struct ChannelTable {
    slots: HashMap<String, Slot>,
}

impl std::fmt::Debug for ChannelTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelTable")
            .field("open", &self.slots.len())
            .finish()
    }
}

impl ChannelTable {
    /// Channels created and not yet fully taken apart.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Creates a channel; returns the `{writer, reader}` refs the protocol hands out.
    pub fn create(&mut self, buffer_size: Option<usize>) -> Value {
        let buffer = buffer_size.unwrap_or(DEFAULT_BUFFER).clamp(1, MAX_BUFFER);
        let (tx, rx) = mpsc::channel(buffer);
        let id = uuid::Uuid::new_v4().to_string();
        let slot = Slot {
            writer_key: uuid::Uuid::new_v4().to_string(),
            reader_key: uuid::Uuid::new_v4().to_string(),
            tx: Some(tx),
            rx: Some(rx),
        };
        let refs = json!({
            "writer": {"channel_id": id, "access_key": slot.writer_key, "direction": "write"},
            "reader": {"channel_id": id, "access_key": slot.reader_key, "direction": "read"},
        });
        self.slots.insert(id, slot);
        refs
    }

    /// Whether `key` opens the `dir` end of channel `id` (checked before the upgrade).
    pub fn authorizes(&self, id: &str, key: &str, dir: Direction) -> bool {
        self.slots.get(id).is_some_and(|slot| match dir {
            Direction::Read => slot.reader_key == key,
            Direction::Write => slot.writer_key == key,
        })
    }

    /// Hands the end to its socket; the channel is forgotten once both ends are taken.
    pub fn take(&mut self, id: &str, key: &str, dir: Direction) -> ChannelEnd {
        if !self.authorizes(id, key, dir) {
            return ChannelEnd::Taken;
        }
        let Some(slot) = self.slots.get_mut(id) else {
            return ChannelEnd::Taken;
        };
        let end = match dir {
            Direction::Read => slot.rx.take().map(ChannelEnd::Reader),
            Direction::Write => slot.tx.take().map(ChannelEnd::Writer),
        };
        if slot.rx.is_none() && slot.tx.is_none() {
            self.slots.remove(id);
        }
        end.unwrap_or(ChannelEnd::Taken)
    }
}

/// `(channel_id, key, dir)` from a channel socket's path and query, or `None` for other paths.
pub fn parse_channel_path(path: &str, query: Option<&str>) -> Option<(String, String, String)> {
    let id = path.strip_prefix("/ws/channels/")?.trim_end_matches('/');
    if id.is_empty() || id.contains('/') {
        return None;
    }
    let mut key = String::new();
    let mut dir = String::new();
    for pair in query.unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "key" => key = percent_decode(value),
            "dir" => dir = percent_decode(value),
            _ => {}
        }
    }
    Some((id.to_string(), key, dir))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_channel_paths_and_decodes_keys() {
        let parsed = parse_channel_path("/ws/channels/abc", Some("key=a%2Bb%3D&dir=write"));
        assert_eq!(parsed, Some(("abc".into(), "a+b=".into(), "write".into())));
        assert_eq!(parse_channel_path("/", None), None);
        assert_eq!(parse_channel_path("/ws/channels/", None), None);
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn each_end_is_taken_once_with_its_own_key() {
        let mut table = ChannelTable::default();
        let refs = table.create(Some(4));
        let id = refs["writer"]["channel_id"].as_str().unwrap().to_string();
        let wkey = refs["writer"]["access_key"].as_str().unwrap().to_string();
        let rkey = refs["reader"]["access_key"].as_str().unwrap().to_string();
        assert!(!table.authorizes(&id, &rkey, Direction::Write));
        assert!(matches!(
            table.take(&id, &wkey, Direction::Write),
            ChannelEnd::Writer(_)
        ));
        assert!(matches!(
            table.take(&id, &wkey, Direction::Write),
            ChannelEnd::Taken
        ));
        assert!(matches!(
            table.take(&id, &rkey, Direction::Read),
            ChannelEnd::Reader(_)
        ));
        assert!(!table.authorizes(&id, &rkey, Direction::Read));
    }
}
