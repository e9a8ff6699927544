//! `list`: live sandboxes with their exec occupancy, then those whose agent died by itself
//! (`stopped: true` and a `cause`, until a `stop` names them or their idle timeout passes;
//! they hold no slot), and the adapter-wide slots. Warm-pool sandboxes are not listed: they
//! are nobody's yet; `pooled` counts the slots they hold, which yield to a create, so
//! `remaining` leaves them out. `paused` says whether a sandbox's processes are frozen
//! (`pause`), `exposed_ports` its open `port::expose` URLs, `running_execs` its execs in
//! flight (`exec_id`, `argv0`, `started_at`: what `exec::cancel` needs, nothing more).

use std::time::SystemTime;

use serde_json::{json, Value};

use crate::backend::Backend;
use crate::plugin::SandboxPlugin;

pub fn list<B: Backend>(plugin: &SandboxPlugin<B>) -> Value {
    let now = SystemTime::now();
    let (live, dead) = plugin.registry.listing();
    let sandboxes: Vec<Value> = live
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
                "paused": s.is_paused(),
                "bus_functions": plugin.buses.functions(s.id),
                "exposed_ports": s.exposures.listing(),
                "running_execs": s.execs.listing(),
            })
        })
        .chain(dead.into_iter().map(|dead| {
            json!({
                "sandbox_id": dead.id.to_string(),
                "name": dead.name,
                "image": dead.image,
                "age_secs": now.duration_since(dead.created).map(|d| d.as_secs()).unwrap_or(0),
                "exec_in_progress": false,
                "exec_in_flight": 0,
                "exec_slots_free": 0,
                "stopped": true,
                "paused": false,
                "cause": dead.cause,
            })
        }))
        .collect();
    let occupancy = plugin.registry.occupancy();
    json!({
        "sandboxes": sandboxes,
        "in_flight": occupancy.in_flight,
        "cap": occupancy.cap,
        "remaining": occupancy.cap.saturating_sub(occupancy.in_flight),
        "pooled": occupancy.pooled,
        "reconciled": plugin.reconciled,
    })
}
