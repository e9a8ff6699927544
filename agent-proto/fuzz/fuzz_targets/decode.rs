//! Any byte stream must decode into frames and messages or errors, never a panic.
#![no_main]

use agent_proto::{Frame, Message, MAX_PAYLOAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut cursor = data;
    while let Ok(frame) = Frame::read_from(&mut cursor) {
        assert!(frame.payload.len() <= MAX_PAYLOAD);
        if let Ok(msg) = Message::from_frame(frame) {
            // What decodes must encode again.
            let _ = msg.into_frame(1).expect("re-encodes");
        }
    }
});
