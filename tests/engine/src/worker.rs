//! Connected workers: identity, reattach secret, outbound queue and held registrations.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::functions::FunctionDef;

/// What a connection task writes to its socket.
#[derive(Debug)]
pub enum Outgoing {
    /// One JSON message as a text frame.
    Frame(String),
    /// Close the connection (after a fatal rejection or a reattach).
    Close,
}

/// What `engine::workers::register` tells the engine about a worker.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Identity {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub runtime: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub isolation: Option<String>,
}

impl Identity {
    /// The namespace this worker registers in: the one it named, else `default`.
    pub fn namespace(&self) -> &str {
        self.namespace
            .as_deref()
            .filter(|ns| !ns.trim().is_empty())
            .unwrap_or(crate::wire::DEFAULT_NAMESPACE)
    }
}

/// One live worker connection.
#[derive(Debug)]
pub struct Worker {
    pub id: String,
    pub reattach_token: String,
    pub ip_address: Option<String>,
    pub connected_at_ms: u64,
    /// Set by `engine::workers::register`.
    pub identity: Option<Identity>,
    /// Registrations received before the worker's namespace is known.
    pub held: Vec<FunctionDef>,
    /// True once the grace period ran out: registrations land in `default` directly.
    pub grace_expired: bool,
    tx: mpsc::UnboundedSender<Outgoing>,
}

impl Worker {
    pub fn new(
        id: String,
        ip_address: Option<String>,
        tx: mpsc::UnboundedSender<Outgoing>,
    ) -> Self {
        Self {
            id,
            reattach_token: uuid::Uuid::new_v4().to_string(),
            ip_address,
            connected_at_ms: now_ms(),
            identity: None,
            held: Vec::new(),
            grace_expired: false,
            tx,
        }
    }

    /// Queues one message; false when the connection is already gone.
    pub fn send(&self, message: &Value) -> bool {
        self.tx.send(Outgoing::Frame(message.to_string())).is_ok()
    }

    pub fn close(&self) {
        let _ = self.tx.send(Outgoing::Close);
    }

    pub fn name(&self) -> Option<&str> {
        self.identity.as_ref().and_then(|i| i.name.as_deref())
    }

    /// The namespace registrations go to now, or `None` while they are held.
    pub fn registration_namespace(&self) -> Option<&str> {
        match &self.identity {
            Some(identity) => Some(identity.namespace()),
            None if self.grace_expired => Some(crate::wire::DEFAULT_NAMESPACE),
            None => None,
        }
    }
}

/// All live workers by id.
#[derive(Debug, Default)]
pub struct WorkerTable {
    workers: HashMap<String, Worker>,
}

impl WorkerTable {
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn insert(&mut self, worker: Worker) {
        self.workers.insert(worker.id.clone(), worker);
    }

    pub fn get(&self, id: &str) -> Option<&Worker> {
        self.workers.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Worker> {
        self.workers.get_mut(id)
    }

    pub fn remove(&mut self, id: &str) -> Option<Worker> {
        self.workers.remove(id)
    }

    /// Sends to a worker; false when it is unknown or gone.
    pub fn send(&self, id: &str, message: &Value) -> bool {
        self.workers.get(id).is_some_and(|w| w.send(message))
    }

    /// Another registered worker holding `name` in `namespace`, if any.
    pub fn holder_of_name(&self, name: &str, namespace: &str, except: &str) -> Option<&Worker> {
        self.workers.values().find(|w| {
            w.id != except
                && w.identity
                    .as_ref()
                    .is_some_and(|i| i.name.as_deref() == Some(name) && i.namespace() == namespace)
        })
    }

    /// Workers in connection order, for listings.
    pub fn sorted(&self) -> Vec<&Worker> {
        let mut all: Vec<&Worker> = self.workers.values().collect();
        all.sort_by(|a, b| (a.connected_at_ms, &a.id).cmp(&(b.connected_at_ms, &b.id)));
        all
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
