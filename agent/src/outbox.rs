//! The agent's single writer: frames from every thread go out whole, one at a time.

use std::io::Write;
use std::sync::{Arc, Mutex};

use agent_proto::Message;

use crate::log::log;

#[derive(Clone)]
pub struct Outbox {
    writer: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl Outbox {
    pub fn new(writer: Box<dyn Write + Send>) -> Outbox {
        Outbox {
            writer: Arc::new(Mutex::new(writer)),
        }
    }

    /// Sends one message. A failed write means the host is gone; the reader sees the
    /// same and shuts the agent down, so the error is only logged here.
    pub fn send(&self, id: u32, msg: Message) {
        let frame = match msg.into_frame(id) {
            Ok(frame) => frame,
            Err(e) => {
                log!("cannot encode a message for request {id}: {e}");
                return;
            }
        };
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = frame.write_to(&mut *writer) {
            log!("write to host failed: {e}");
        }
    }
}
