//! Calls forwarded to an owner and not yet answered.

use std::collections::HashMap;

/// One forwarded call. The engine's id for the owner leg is the table key; it equals the
/// caller's id unless that id was already in flight.
#[derive(Debug, Clone)]
pub struct PendingCall {
    pub caller: String,
    pub caller_invocation_id: String,
    pub owner: String,
    pub function_id: String,
}

#[derive(Debug, Default)]
pub struct PendingTable {
    calls: HashMap<String, PendingCall>,
}

impl PendingTable {
    /// Records a call and returns the invocation id to send to the owner.
    pub fn insert(&mut self, call: PendingCall) -> String {
        let mut leg_id = call.caller_invocation_id.clone();
        while self.calls.contains_key(&leg_id) {
            leg_id = uuid::Uuid::new_v4().to_string();
        }
        self.calls.insert(leg_id.clone(), call);
        leg_id
    }

    /// Takes the call `leg_id` when `owner` is the worker it was sent to.
    pub fn complete(&mut self, leg_id: &str, owner: &str) -> Option<PendingCall> {
        match self.calls.get(leg_id) {
            Some(call) if call.owner == owner => self.calls.remove(leg_id),
            _ => None,
        }
    }

    /// Removes every call that involves `worker`; returns those it owed an answer on.
    pub fn drop_worker(&mut self, worker: &str) -> Vec<PendingCall> {
        let mut stopped = Vec::new();
        self.calls.retain(|_, call| {
            if call.owner == worker {
                if call.caller != worker {
                    stopped.push(call.clone());
                }
                false
            } else {
                call.caller != worker
            }
        });
        stopped
    }

    pub fn in_flight_for(&self, owner: &str) -> usize {
        self.calls.values().filter(|c| c.owner == owner).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(caller: &str, id: &str, owner: &str) -> PendingCall {
        PendingCall {
            caller: caller.into(),
            caller_invocation_id: id.into(),
            owner: owner.into(),
            function_id: "f".into(),
        }
    }

    #[test]
    fn colliding_ids_get_a_fresh_leg_id() {
        let mut table = PendingTable::default();
        let first = table.insert(call("a", "1", "o"));
        let second = table.insert(call("b", "1", "o"));
        assert_eq!(first, "1");
        assert_ne!(second, "1");
        assert_eq!(table.complete(&second, "o").unwrap().caller, "b");
    }

    #[test]
    fn only_the_owner_completes_a_call() {
        let mut table = PendingTable::default();
        let id = table.insert(call("a", "1", "o"));
        assert!(table.complete(&id, "intruder").is_none());
        assert!(table.complete(&id, "o").is_some());
    }

    #[test]
    fn dropping_an_owner_reports_its_callers() {
        let mut table = PendingTable::default();
        table.insert(call("a", "1", "o"));
        table.insert(call("o", "2", "b"));
        let stopped = table.drop_worker("o");
        assert_eq!(stopped.len(), 1);
        assert_eq!(stopped[0].caller, "a");
        assert_eq!(table.in_flight_for("b"), 0);
    }
}
