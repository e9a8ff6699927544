//! The engine's whole state behind one lock. Every operation is short and never awaits while
//! holding it; connections get their messages through unbounded queues.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::channels::ChannelTable;
use crate::config_store::ConfigStore;
use crate::env::EngineEnv;
use crate::functions::FunctionTable;
use crate::http_function::UrlPolicy;
use crate::pending::PendingTable;
use crate::triggers::TriggerTable;
use crate::worker::WorkerTable;

#[derive(Debug, Default)]
pub struct State {
    pub workers: WorkerTable,
    pub functions: FunctionTable,
    pub pending: PendingTable,
    pub channels: ChannelTable,
    pub triggers: TriggerTable,
    pub config: ConfigStore,
    /// What `${VAR}` expansion and HTTP functions' credentials read.
    pub env: EngineEnv,
    /// Which URLs HTTP-invoked functions may name.
    pub url_policy: UrlPolicy,
}

#[derive(Debug)]
pub struct Shared {
    state: Mutex<State>,
    /// How long registrations wait for `engine::workers::register` before landing in `default`.
    pub registration_grace: Duration,
}

pub type SharedRef = Arc<Shared>;

impl Shared {
    pub fn new(state: State, registration_grace: Duration) -> SharedRef {
        Arc::new(Self {
            state: Mutex::new(state),
            registration_grace,
        })
    }

    /// The state; a panic elsewhere while holding the lock must not wedge the engine.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
