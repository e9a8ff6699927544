//! `exec::cancel`: ends a running exec by its `exec_id`. Every exec is registered here while
//! it runs (one map insert and one remove: the whole cost on the exec path); a cancel sends
//! the signal to the exec's process group in the agent (SIGKILL follows after
//! `agent_proto::process::SIGNAL_GRACE` unless it ends), and the exec answers
//! `cancelled: true` once its program has ended, leaving its exec slot then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::plugin::SandboxPlugin;
use crate::request::{parse, sandbox_id};

/// Characters of `argv[0]` that `list` shows of a running exec.
const ARGV0_SHOWN: usize = 256;

/// The execs running in one sandbox.
#[derive(Default)]
pub struct RunningExecs {
    map: Mutex<HashMap<Uuid, RunningExec>>,
}

struct RunningExec {
    argv0: String,
    started_at: SystemTime,
    signals: mpsc::UnboundedSender<i32>,
    cancelled: Arc<AtomicBool>,
}

/// An exec's registration: dropped when the exec ends, which forgets it.
pub struct ExecTicket<'a> {
    execs: &'a RunningExecs,
    pub id: Uuid,
    cancelled: Arc<AtomicBool>,
}

impl ExecTicket<'_> {
    /// Whether a cancel reached this exec.
    pub fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

impl Drop for ExecTicket<'_> {
    fn drop(&mut self) {
        lock(&self.execs.map).remove(&self.id);
    }
}

impl RunningExecs {
    /// Registers an exec of `argv0`; the receiver gets the signals cancels ask for.
    pub fn register(&self, argv0: &str) -> (ExecTicket<'_>, mpsc::UnboundedReceiver<i32>) {
        let (signals, rx) = mpsc::unbounded_channel();
        let id = Uuid::new_v4();
        let cancelled = Arc::new(AtomicBool::new(false));
        let argv0 = argv0.chars().take(ARGV0_SHOWN).collect();
        let exec = RunningExec {
            argv0,
            started_at: SystemTime::now(),
            signals,
            cancelled: cancelled.clone(),
        };
        lock(&self.map).insert(id, exec);
        let ticket = ExecTicket {
            execs: self,
            id,
            cancelled,
        };
        (ticket, rx)
    }

    /// Asks exec `id` to end with `signal`; false when no such exec runs.
    pub fn cancel(&self, id: Uuid, signal: i32) -> bool {
        let map = lock(&self.map);
        let Some(exec) = map.get(&id) else {
            return false;
        };
        exec.cancelled.store(true, Ordering::SeqCst);
        // A closed receiver means the exec is ending anyway.
        let _ = exec.signals.send(signal);
        true
    }

    /// `[{exec_id, argv0, started_at}]`, oldest first (no arguments nor environment).
    pub fn listing(&self) -> Vec<Value> {
        let map = lock(&self.map);
        let mut execs: Vec<(&Uuid, &RunningExec)> = map.iter().collect();
        execs.sort_by_key(|(_, e)| e.started_at);
        execs
            .into_iter()
            .map(|(id, e)| {
                json!({
                    "exec_id": id.to_string(),
                    "argv0": e.argv0,
                    "started_at": rfc3339(e.started_at),
                })
            })
            .collect()
    }
}

pub(crate) fn rfc3339(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The signals a caller may name, and their numbers (Linux's, the same on every target).
const SIGNALS: [(&str, i32); 5] = [
    ("SIGTERM", 15),
    ("SIGKILL", 9),
    ("SIGINT", 2),
    ("SIGHUP", 1),
    ("SIGQUIT", 3),
];

/// `signal` as a request gave it: a name with or without `SIG` (`"TERM"`, `"SIGKILL"`, any
/// case) or its number; absent or null is SIGTERM. Anything else is S001.
pub fn signal(value: Option<&Value>) -> Result<i32, SandboxError> {
    let bad = || {
        SandboxError::InvalidRequest(
            "`signal` must be one of TERM, KILL, INT, HUP, QUIT (or SIGTERM, ..., or 15, 9, 2, \
             1, 3)"
                .into(),
        )
    };
    match value {
        None | Some(Value::Null) => Ok(15),
        Some(Value::String(name)) => {
            let upper = name.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            SIGNALS
                .iter()
                .find(|(n, _)| *n == full)
                .map(|(_, s)| *s)
                .ok_or_else(bad)
        }
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|n| SIGNALS.iter().find(|(_, s)| i64::from(*s) == n))
            .map(|(_, s)| *s)
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

pub fn signal_schema() -> Value {
    json!({
        "description": "Signal for the process group (default SIGTERM; SIGKILL follows 2 s later unless it ends)",
        "default": "SIGTERM",
        "oneOf": [
            {"type": "string", "enum": ["TERM", "KILL", "INT", "HUP", "QUIT", "SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT"]},
            {"type": "integer", "enum": [15, 9, 2, 1, 3]}
        ]
    })
}

#[derive(Debug, Deserialize)]
struct CancelRequest {
    sandbox_id: String,
    exec_id: String,
    signal: Option<Value>,
}

/// `exec::cancel {sandbox_id, exec_id, signal?}` -> `{sandbox_id, exec_id, cancelled: true}`
/// once the signal is on its way (the exec itself answers `cancelled: true`). An `exec_id`
/// no running exec of the sandbox has (never, or already ended) is S001.
pub async fn cancel<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: CancelRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    let signal = signal(request.signal.as_ref())?;
    let exec_id = Uuid::parse_str(&request.exec_id).map_err(|_| {
        SandboxError::InvalidRequest("`exec_id` must be the UUID an exec was given".into())
    })?;
    let sandbox = plugin.registry.live_sandbox(id)?;
    if !sandbox.execs.cancel(exec_id, signal) {
        return Err(SandboxError::InvalidRequest(format!(
            "no exec {exec_id} is running in sandbox {id} (it ended, or never ran there)"
        )));
    }
    Ok(json!({"sandbox_id": id.to_string(), "exec_id": exec_id.to_string(), "cancelled": true}))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_the_five_by_name_or_number_and_term_by_default() {
        assert_eq!(signal(None).unwrap(), 15);
        assert_eq!(signal(Some(&Value::Null)).unwrap(), 15);
        for (given, want) in [
            (json!("TERM"), 15),
            (json!("sigkill"), 9),
            (json!("SIGINT"), 2),
            (json!("hup"), 1),
            (json!(3), 3),
            (json!(9), 9),
        ] {
            assert_eq!(signal(Some(&given)).unwrap(), want, "{given}");
        }
        for bad in [
            json!("STOP"),
            json!("SIGUSR1"),
            json!(""),
            json!(19),
            json!(-9),
            json!(15.5),
            json!([15]),
            json!(true),
        ] {
            assert_eq!(signal(Some(&bad)).unwrap_err().code(), "S001", "{bad}");
        }
    }

    #[tokio::test]
    async fn a_cancel_reaches_a_registered_exec_and_not_an_ended_one() {
        let execs = RunningExecs::default();
        let (ticket, mut rx) = execs.register("sleep");
        let id = ticket.id;
        assert_eq!(execs.listing().len(), 1);
        assert_eq!(execs.listing()[0]["argv0"], "sleep");
        assert!(!ticket.cancelled());
        assert!(execs.cancel(id, 9));
        assert!(ticket.cancelled());
        assert_eq!(rx.recv().await, Some(9));
        drop(ticket);
        assert!(execs.listing().is_empty());
        assert!(!execs.cancel(id, 15));
        assert!(!execs.cancel(Uuid::new_v4(), 15));
    }
}
