//! Trigger types and their bindings, as the real engine routes them.
//!
//! - `registertriggertype {id, description, ...}` makes the sending worker the type's owner
//!   (a later registration of the same id replaces the owner). No answer. Every binding of the
//!   type (live or parked) is sent to the new owner as `registertrigger`.
//! - `registertrigger {id, trigger_type, function_id, config, metadata?, namespace?}` from a
//!   subscriber is stored and forwarded to the type's owner unchanged but for the fields the
//!   engine sets; no answer to the subscriber when it goes through. A binding of a type nobody
//!   provides yet is parked and sent once the type registers.
//! - `triggerregistrationresult {id, trigger_type, function_id, error?}` counts only from the
//!   type's owner. With an error the binding is parked and the result forwarded to the
//!   subscriber that registered it.
//! - `unregistertrigger {id, trigger_type?}` drops the binding; a live one is passed to the
//!   owner as `unregistertrigger {id, trigger_type}`.
//! - When a subscriber disconnects, its bindings go as if it had unregistered each. When an
//!   owner disconnects (or sends `unregistertriggertype`), its types go and their bindings are
//!   parked until the type registers again.
//!
//! Not modelled: namespaces of providers (a type id is one type engine-wide), RBAC and hooks.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::worker::WorkerTable;

/// A trigger type and the worker that provides it.
#[derive(Debug, Clone)]
pub struct TriggerType {
    pub owner: String,
    pub description: String,
}

/// One binding of a function to a trigger type.
#[derive(Debug, Clone)]
pub struct Binding {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    /// The worker that registered it.
    pub subscriber: String,
    /// The message's fields the owner receives (config, metadata, namespace).
    pub extra: Map<String, Value>,
}

impl Binding {
    fn register_frame(&self) -> Value {
        let mut frame = self.extra.clone();
        frame.insert("type".into(), "registertrigger".into());
        frame.insert("id".into(), self.id.clone().into());
        frame.insert("trigger_type".into(), self.trigger_type.clone().into());
        frame.insert("function_id".into(), self.function_id.clone().into());
        frame
            .entry("config")
            .or_insert_with(|| Value::Object(Map::new()));
        Value::Object(frame)
    }

    fn unregister_frame(&self) -> Value {
        json!({"type": "unregistertrigger", "id": self.id, "trigger_type": self.trigger_type})
    }
}

#[derive(Debug, Default)]
pub struct TriggerTable {
    types: HashMap<String, TriggerType>,
    /// Bindings sent to their type's owner.
    live: HashMap<String, Binding>,
    /// Bindings waiting for their type (none yet, or its owner refused them).
    parked: HashMap<String, Binding>,
}

impl TriggerTable {
    pub fn type_count(&self) -> usize {
        self.types.len()
    }

    pub fn binding_count(&self) -> usize {
        self.live.len() + self.parked.len()
    }

    /// `registertriggertype` from `owner`.
    pub fn register_type(
        &mut self,
        workers: &WorkerTable,
        owner: &str,
        id: String,
        description: String,
    ) {
        self.types.insert(
            id.clone(),
            TriggerType {
                owner: owner.to_string(),
                description,
            },
        );
        // Live bindings of a replaced owner go to the new one, then the parked ones.
        let mut resend: Vec<String> = self
            .live
            .values()
            .filter(|b| b.trigger_type == id)
            .map(|b| b.id.clone())
            .collect();
        let waiting: Vec<String> = self
            .parked
            .values()
            .filter(|b| b.trigger_type == id)
            .map(|b| b.id.clone())
            .collect();
        for binding_id in waiting {
            if let Some(binding) = self.parked.remove(&binding_id) {
                self.live.insert(binding_id.clone(), binding);
                resend.push(binding_id);
            }
        }
        for binding_id in resend {
            if let Some(binding) = self.live.get(&binding_id) {
                workers.send(owner, &binding.register_frame());
            }
        }
        tracing::debug!(owner, trigger_type = %id, description = %self.types[&id].description, "trigger type registered");
    }

    /// `unregistertriggertype` from `owner`: only the owner's own type goes.
    pub fn unregister_type(&mut self, owner: &str, id: &str) {
        if self.types.get(id).is_some_and(|t| t.owner == owner) {
            self.types.remove(id);
            self.park_bindings_of(id);
        }
    }

    /// `registertrigger` from `subscriber`; `raw` is the whole message.
    pub fn register(&mut self, workers: &WorkerTable, subscriber: &str, raw: &Value) {
        let field = |name: &str| raw.get(name).and_then(Value::as_str).map(str::to_string);
        let (Some(id), Some(trigger_type), Some(function_id)) =
            (field("id"), field("trigger_type"), field("function_id"))
        else {
            tracing::debug!(
                subscriber,
                "registertrigger without id, trigger_type or function_id; ignored"
            );
            return;
        };
        let mut extra = Map::new();
        for key in ["config", "metadata", "namespace"] {
            if let Some(value) = raw.get(key).filter(|v| !v.is_null()) {
                extra.insert(key.to_string(), value.clone());
            }
        }
        let binding = Binding {
            id: id.clone(),
            trigger_type: trigger_type.clone(),
            function_id,
            subscriber: subscriber.to_string(),
            extra,
        };
        match self.types.get(&trigger_type) {
            Some(provider) => {
                self.parked.remove(&id);
                if workers.send(&provider.owner, &binding.register_frame()) {
                    self.live.insert(id, binding);
                } else {
                    self.live.remove(&id);
                    self.parked.insert(id, binding);
                }
            }
            None => {
                tracing::info!(subscriber, trigger_id = %id, %trigger_type,
                    "trigger type not registered: the binding waits for it");
                self.live.remove(&id);
                self.parked.insert(id, binding);
            }
        }
    }

    /// `unregistertrigger` from a worker.
    pub fn unregister(&mut self, workers: &WorkerTable, id: &str) {
        if self.parked.remove(id).is_some() {
            return;
        }
        if let Some(binding) = self.live.remove(id) {
            if let Some(provider) = self.types.get(&binding.trigger_type) {
                workers.send(&provider.owner, &binding.unregister_frame());
            }
        }
    }

    /// `triggerregistrationresult` from `sender`; `raw` is the whole message.
    pub fn result(&mut self, workers: &WorkerTable, sender: &str, raw: &Value) {
        let Some(id) = raw.get("id").and_then(Value::as_str) else {
            return;
        };
        let Some(binding) = self.live.get(id) else {
            return;
        };
        let owner = self
            .types
            .get(&binding.trigger_type)
            .map(|t| t.owner.as_str());
        if owner != Some(sender) {
            tracing::warn!(
                sender,
                trigger_id = id,
                "triggerregistrationresult from a worker that does not provide the type; ignored"
            );
            return;
        }
        let Some(error) = raw.get("error").filter(|e| !e.is_null()) else {
            return;
        };
        let Some(binding) = self.live.remove(id) else {
            return;
        };
        let forward = json!({
            "type": "triggerregistrationresult",
            "id": binding.id,
            "trigger_type": binding.trigger_type,
            "function_id": binding.function_id,
            "error": error,
        });
        workers.send(&binding.subscriber, &forward);
        self.parked.insert(binding.id.clone(), binding);
    }

    /// A worker went away: its bindings are unregistered with their owners, its types removed
    /// and their bindings parked.
    pub fn disconnect(&mut self, workers: &WorkerTable, worker_id: &str) {
        let theirs: Vec<String> = self
            .live
            .values()
            .filter(|b| b.subscriber == worker_id)
            .map(|b| b.id.clone())
            .collect();
        for id in theirs {
            self.unregister(workers, &id);
        }
        self.parked.retain(|_, b| b.subscriber != worker_id);
        let owned: Vec<String> = self
            .types
            .iter()
            .filter(|(_, t)| t.owner == worker_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in owned {
            self.types.remove(&id);
            self.park_bindings_of(&id);
        }
    }

    fn park_bindings_of(&mut self, trigger_type: &str) {
        let orphaned: Vec<String> = self
            .live
            .values()
            .filter(|b| b.trigger_type == trigger_type)
            .map(|b| b.id.clone())
            .collect();
        for id in orphaned {
            if let Some(binding) = self.live.remove(&id) {
                self.parked.insert(id, binding);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::{Outgoing, Worker};
    use tokio::sync::mpsc;

    struct Peer {
        rx: mpsc::UnboundedReceiver<Outgoing>,
    }

    impl Peer {
        fn frames(&mut self) -> Vec<Value> {
            let mut out = Vec::new();
            while let Ok(Outgoing::Frame(text)) = self.rx.try_recv() {
                out.push(serde_json::from_str(&text).unwrap());
            }
            out
        }
    }

    fn worker(workers: &mut WorkerTable, id: &str) -> Peer {
        let (tx, rx) = mpsc::unbounded_channel();
        workers.insert(Worker::new(id.into(), None, tx));
        Peer { rx }
    }

    fn bind(id: &str, trigger_type: &str) -> Value {
        json!({"type": "registertrigger", "id": id, "trigger_type": trigger_type,
               "function_id": "sub::on", "config": {"kinds": ["ready"]}, "namespace": "ns"})
    }

    #[test]
    fn a_binding_reaches_the_owner_with_its_config_and_unregisters_on_disconnect() {
        let mut workers = WorkerTable::default();
        let mut owner = worker(&mut workers, "owner");
        let _sub = worker(&mut workers, "sub");
        let mut table = TriggerTable::default();
        table.register_type(&workers, "owner", "a::event".into(), "d".into());
        table.register(&workers, "sub", &bind("t1", "a::event"));
        let frames = owner.frames();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0]["type"], "registertrigger");
        assert_eq!(frames[0]["id"], "t1");
        assert_eq!(frames[0]["function_id"], "sub::on");
        assert_eq!(frames[0]["config"], json!({"kinds": ["ready"]}));
        assert_eq!(frames[0]["namespace"], "ns");
        table.disconnect(&workers, "sub");
        let frames = owner.frames();
        assert_eq!(
            frames,
            [json!({"type": "unregistertrigger", "id": "t1", "trigger_type": "a::event"})]
        );
        assert_eq!(table.binding_count(), 0);
    }

    #[test]
    fn a_binding_before_its_type_waits_and_survives_an_owner_restart() {
        let mut workers = WorkerTable::default();
        let mut first = worker(&mut workers, "first");
        let mut second = worker(&mut workers, "second");
        let _sub = worker(&mut workers, "sub");
        let mut table = TriggerTable::default();
        table.register(&workers, "sub", &bind("t1", "a::event"));
        assert_eq!(table.binding_count(), 1);
        table.register_type(&workers, "first", "a::event".into(), "d".into());
        assert_eq!(first.frames()[0]["id"], "t1");
        table.disconnect(&workers, "first");
        assert_eq!(table.type_count(), 0);
        assert_eq!(table.binding_count(), 1, "parked, not lost");
        table.register_type(&workers, "second", "a::event".into(), "d".into());
        assert_eq!(second.frames()[0]["id"], "t1");
    }

    #[test]
    fn a_refusal_counts_only_from_the_owner_and_reaches_the_subscriber() {
        let mut workers = WorkerTable::default();
        let _owner = worker(&mut workers, "owner");
        let mut sub = worker(&mut workers, "sub");
        let _other = worker(&mut workers, "other");
        let mut table = TriggerTable::default();
        table.register_type(&workers, "owner", "a::event".into(), "d".into());
        table.register(&workers, "sub", &bind("t1", "a::event"));
        let refusal = json!({"type": "triggerregistrationresult", "id": "t1",
            "trigger_type": "a::event", "function_id": "sub::on",
            "error": {"code": "trigger_registration_failed", "message": "S001 bad"}});
        table.result(&workers, "other", &refusal);
        assert!(sub.frames().is_empty(), "a spoofed refusal is ignored");
        table.result(&workers, "owner", &refusal);
        let frames = sub.frames();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0]["error"]["message"], "S001 bad");
        assert_eq!(table.live.len(), 0);
        assert_eq!(table.parked.len(), 1);
    }

    #[test]
    fn unregister_goes_to_the_owner_once() {
        let mut workers = WorkerTable::default();
        let mut owner = worker(&mut workers, "owner");
        let _sub = worker(&mut workers, "sub");
        let mut table = TriggerTable::default();
        table.register_type(&workers, "owner", "a::event".into(), "d".into());
        table.register(&workers, "sub", &bind("t1", "a::event"));
        owner.frames();
        table.unregister(&workers, "t1");
        table.unregister(&workers, "t1");
        assert_eq!(owner.frames().len(), 1);
        // Only the owner may withdraw its type.
        table.unregister_type("sub", "a::event");
        assert_eq!(table.type_count(), 1);
        table.unregister_type("owner", "a::event");
        assert_eq!(table.type_count(), 0);
    }
}
