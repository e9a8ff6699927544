//! Streamed exec's other end, for tests that read it: engine channels and the stream's
//! NDJSON lines (`{"stream":..,"data_b64":..}`, then `{"exit":{..}}`).

use std::time::Duration;

use base64::Engine as _;
use e2e_tests::Stack;
use iii_sdk::channel::{ChannelReader, StreamChannelRef};
use serde_json::{json, Value};

/// A fresh engine channel: `(write end ref, read end ref)`.
pub async fn channel(stack: &Stack) -> (Value, Value) {
    let created = stack
        .client
        .invoke(
            "engine::channels::create",
            json!({}),
            Duration::from_secs(10),
        )
        .await
        .expect("engine::channels::create");
    (created["writer"].clone(), created["reader"].clone())
}

pub fn channel_ref(value: &Value) -> StreamChannelRef {
    serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{value}: {e}"))
}

/// One line of the stream, decoded.
#[derive(Debug)]
pub enum Line {
    Out(Vec<u8>),
    Err(Vec<u8>),
    Exit(Value),
}

/// Reads the stream's NDJSON (lines may span channel frames), one [`Line`] at a time.
/// The first line, `{"exec_id": ..}`, is kept in `exec_id` rather than returned.
pub struct LineReader {
    reader: ChannelReader,
    pending: Vec<u8>,
    pub exec_id: Option<String>,
}

impl LineReader {
    pub fn new(stack: &Stack, read_end: &Value) -> LineReader {
        LineReader {
            reader: ChannelReader::new(&stack.engine.url(), &channel_ref(read_end)),
            pending: Vec::new(),
            exec_id: None,
        }
    }

    /// The next line, or `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Line> {
        loop {
            if let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                let line = &line[..line.len() - 1];
                if let Some(id) = exec_id_line(line) {
                    self.exec_id = Some(id);
                    continue;
                }
                return Some(decode(line));
            }
            let frame = tokio::time::timeout(Duration::from_secs(60), self.reader.next_binary())
                .await
                .expect("the stream goes on or ends within 60 s")
                .expect("the stream reads");
            match frame {
                Some(data) => self.pending.extend(data),
                None => {
                    assert!(self.pending.is_empty(), "a torn last line");
                    return None;
                }
            }
        }
    }
}

/// The exec's id, when `line` is the stream's first line `{"exec_id": ..}`.
pub fn exec_id_line(line: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(line).ok()?;
    Some(value.get("exec_id")?.as_str()?.to_string())
}

fn decode(line: &[u8]) -> Line {
    let value: Value = serde_json::from_slice(line)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(line)));
    if let Some(exit) = value.get("exit") {
        return Line::Exit(exit.clone());
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(value["data_b64"].as_str().expect("data_b64"))
        .expect("base64");
    match value["stream"].as_str() {
        Some("stdout") => Line::Out(data),
        Some("stderr") => Line::Err(data),
        other => panic!("unknown stream {other:?} in {value}"),
    }
}
