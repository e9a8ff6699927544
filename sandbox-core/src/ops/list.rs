//! `list`: live sandboxes with their exec occupancy, and the adapter-wide slots.

use std::time::SystemTime;

use serde_json::{json, Value};

use crate::backend::Backend;
use crate::plugin::SandboxPlugin;

pub fn list<B: Backend>(plugin: &SandboxPlugin<B>) -> Value {
    let now = SystemTime::now();
    let sandboxes: Vec<Value> = plugin
        .registry
        .live()
        .iter()
        .map(|s| {
            let in_flight = s.execs_in_flight();
            json!({
                "sandbox_id": s.id.to_string(),
                "name": s.name,
                "image": s.image,
                "age_secs": now.duration_since(s.created).map(|d| d.as_secs()).unwrap_or(0),
                "exec_in_progress": in_flight > 0,
                "exec_in_flight": in_flight,
                "exec_slots_free": s.exec_slots_free(),
                "stopped": s.is_stopped(),
            })
        })
        .collect();
    let occupancy = plugin.registry.occupancy();
    json!({
        "sandboxes": sandboxes,
        "in_flight": occupancy.in_flight,
        "cap": occupancy.cap,
        "remaining": occupancy.cap.saturating_sub(occupancy.in_flight),
        "reconciled": plugin.reconciled,
    })
}
