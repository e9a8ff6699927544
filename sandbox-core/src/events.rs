//! Lifecycle events for the trigger type `<prefix>::event` (and the family's
//! `sandbox::provider::<name>::event`): the subscribers the engine forwards to us, and the
//! delivery of each event to them (see docs/events.md).
//!
//! The shell registers the trigger types and passes each `registertrigger` /
//! `unregistertrigger` on as the plugin call `events::subscribe` / `events::unsubscribe`;
//! nothing else reaches these (the shell registers no bus function for them).
//!
//! Emitting never waits and never fails: with no subscriber it is one atomic load; otherwise
//! the event is serialised once and offered to each matching subscriber's queue. Each
//! subscriber has one delivery task that calls its function and waits for the answer (up to
//! [`DELIVERY_TIMEOUT`]) before sending the next event, so its events arrive in order and a
//! subscriber that does not keep up shows as a full queue: it is dropped then, with one
//! warning, and the sandboxes never wait for it. One that no delivery reaches for
//! [`DEAD_AFTER`] is dropped as well.
//!
//! Events carry ids, codes, sizes and times: never a request's payload, an exec's output,
//! environment or file contents.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::error::SandboxError;

/// Events waiting per subscriber; past this the subscriber is dropped.
pub const QUEUE: usize = 256;
/// Subscribers at once (each holds a queue and a task).
pub const MAX_SUBSCRIBERS: usize = 256;
/// How long one delivery may take before the next event goes.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// A subscriber none of whose deliveries succeeded for this long (at least
/// [`DEAD_AFTER_FAILURES`] of them) is dropped: it is gone without the engine having said so
/// (an engine restart forgets bindings without unregistering them). One that comes back
/// registers again, and the engine replays its binding.
pub const DEAD_AFTER: Duration = Duration::from_secs(60);
/// Failed deliveries in a row before [`DEAD_AFTER`] can drop a subscriber.
const DEAD_AFTER_FAILURES: u32 = 3;
/// Longest text field of an event (an agent-lost cause).
const MAX_TEXT: usize = 512;
/// Longest trigger id or function id we keep.
const MAX_ID: usize = 512;
/// Functions an event is never sent to, whatever the subscriber asks: the engine's and iii's
/// sandbox family's (the router, and providers like us). Our own functions, under the prefix
/// the shell serves them with, are refused too (see `SubscribeRequest::prefix`). The adapter
/// makes the call under its own identity, and an event's fields read as a request there: a
/// `created` event sent to a `create` would start another sandbox, and so on.
const RESERVED: &[&str] = &["engine::", "configuration::", "iii::", "sandbox::"];

/// Every kind of event.
pub const KINDS: &[&str] = &[
    "created",
    "ready",
    "paused",
    "resumed",
    "stopped",
    "snapshot_created",
    "forked",
    "port_exposed",
    "port_closed",
    "exec_started",
    "exec_ended",
    "worker_started",
    "worker_exited",
];

/// Why a sandbox stopped (`stopped.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `stop` (or the end of a `run`, a failed `fork`).
    Caller,
    /// Its idle timeout passed.
    Idle,
    /// Its agent went away (`cause` says how).
    AgentLost,
    /// The adapter is shutting down (emitted, though the shell's connection is closed by then).
    AdapterShutdown,
    /// Paused for `max_paused_secs`.
    MaxPaused,
}

impl StopReason {
    fn as_str(self) -> &'static str {
        match self {
            StopReason::Caller => "caller",
            StopReason::Idle => "idle",
            StopReason::AgentLost => "agent_lost",
            StopReason::AdapterShutdown => "adapter_shutdown",
            StopReason::MaxPaused => "max_paused",
        }
    }
}

/// One event before it is stamped and serialised.
#[derive(Debug, Clone)]
pub struct Event {
    kind: &'static str,
    sandbox_id: Option<Uuid>,
    fields: Map<String, Value>,
}

impl Event {
    fn new(kind: &'static str, sandbox_id: Option<Uuid>) -> Self {
        Self {
            kind,
            sandbox_id,
            fields: Map::new(),
        }
    }

    fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    pub fn created(id: Uuid, image: &str, cpus: u32, memory_mb: u32, from_pool: bool) -> Self {
        Self::new("created", Some(id))
            .with("image", bounded(image))
            .with("cpus", cpus)
            .with("memory_mb", memory_mb)
            .with("from_pool", from_pool)
    }

    pub fn ready(id: Uuid) -> Self {
        Self::new("ready", Some(id))
    }

    pub fn paused(id: Uuid) -> Self {
        Self::new("paused", Some(id))
    }

    pub fn resumed(id: Uuid) -> Self {
        Self::new("resumed", Some(id))
    }

    pub fn stopped(id: Uuid, reason: StopReason) -> Self {
        Self::new("stopped", Some(id)).with("reason", reason.as_str())
    }

    /// `stopped {reason: "agent_lost", cause}`.
    pub fn agent_lost(id: Uuid, cause: &str) -> Self {
        Self::stopped(id, StopReason::AgentLost).with("cause", bounded(cause))
    }

    pub fn snapshot_created(id: Uuid, name: &str, size_bytes: u64) -> Self {
        Self::new("snapshot_created", Some(id))
            .with("snapshot", bounded(name))
            .with("size_bytes", size_bytes)
    }

    /// `forked`: `source` gave `sandbox_ids` (each also has its own `created` and `ready`).
    pub fn forked(source: Uuid, sandbox_ids: &[String]) -> Self {
        Self::new("forked", Some(source)).with("sandbox_ids", sandbox_ids.to_vec())
    }

    pub fn port_exposed(id: Uuid, port: u16, host_port: u16) -> Self {
        Self::new("port_exposed", Some(id))
            .with("port", port)
            .with("host_port", host_port)
    }

    pub fn port_closed(id: Uuid, port: u16) -> Self {
        Self::new("port_closed", Some(id)).with("port", port)
    }

    pub fn worker_started(vm_id: &str, image: &str) -> Self {
        Self::new("worker_started", None)
            .with("vm_id", bounded(vm_id))
            .with("image", bounded(image))
    }

    pub fn worker_exited(vm_id: &str, exit_code: Option<i32>, stop_requested: bool) -> Self {
        Self::new("worker_exited", None)
            .with("vm_id", bounded(vm_id))
            .with("exit_code", exit_code)
            .with("stop_requested", stop_requested)
    }

    /// `exec_ended` from an exec's result: its exit code and flags, or the S-code it failed
    /// with; never its output.
    fn exec_ended(id: Uuid, started: Instant, result: &Result<Value, SandboxError>) -> Self {
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let event = Self::new("exec_ended", Some(id)).with("duration_ms", duration_ms);
        let flag = |value: &Value, key: &str| value.get(key).and_then(Value::as_bool);
        match result {
            Ok(value) => event
                .with("exit_code", value.get("exit_code").and_then(Value::as_i64))
                .with("timed_out", flag(value, "timed_out").unwrap_or(false))
                .with("cancelled", flag(value, "cancelled").unwrap_or(false)),
            Err(SandboxError::ExecTimedOut { partial, .. }) => event
                .with(
                    "exit_code",
                    partial.get("exit_code").and_then(Value::as_i64),
                )
                .with("timed_out", true)
                .with("cancelled", flag(partial, "cancelled").unwrap_or(false)),
            Err(e) => event
                .with("exit_code", Value::Null)
                .with("timed_out", false)
                .with("cancelled", false)
                .with("error_code", e.code()),
        }
    }

    /// The JSON a subscriber receives, stamped now.
    fn to_json(&self) -> Value {
        let mut object = Map::with_capacity(self.fields.len() + 3);
        object.insert("kind".into(), self.kind.into());
        if let Some(id) = self.sandbox_id {
            object.insert("sandbox_id".into(), id.to_string().into());
        }
        object.insert(
            "at".into(),
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                .into(),
        );
        object.extend(self.fields.clone());
        Value::Object(object)
    }
}

fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// Where a subscriber's events go: the subscriber's function on the bus (through the shell).
pub trait Deliver: Send + Sync + 'static {
    fn deliver(
        &self,
        function_id: &str,
        event: &Value,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>>;
}

impl Deliver for plugin_api::Host {
    fn deliver(
        &self,
        function_id: &str,
        event: &Value,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>> {
        let host = self.clone();
        let function_id = function_id.to_string();
        let event = event.clone();
        Box::pin(async move {
            host.invoke(&function_id, &event, DELIVERY_TIMEOUT)
                .await
                .map(drop)
        })
    }
}

/// A subscription's `config`: `{kinds?: [..], sandbox_id?: ".."}`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterConfig {
    kinds: Option<Vec<String>>,
    sandbox_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Filter {
    /// Entries of [`KINDS`]; `None` is every kind.
    kinds: Option<Vec<&'static str>>,
    sandbox_id: Option<Uuid>,
}

impl Filter {
    fn parse(config: Value) -> Result<Self, SandboxError> {
        let config: FilterConfig = match config {
            Value::Null => FilterConfig::default(),
            Value::Object(_) => serde_json::from_value(config).map_err(|e| {
                SandboxError::InvalidRequest(format!(
                    "the event trigger's config must be {{kinds?: [..], sandbox_id?: \"..\"}}: {e}"
                ))
            })?,
            other => {
                return Err(SandboxError::InvalidRequest(format!(
                    "the event trigger's config must be an object {{kinds?, sandbox_id?}}, \
                     got {}",
                    crate::config::json_type_name(&other)
                )))
            }
        };
        let kinds = match config.kinds {
            None => None,
            Some(kinds) if kinds.is_empty() => {
                return Err(SandboxError::InvalidRequest(
                    "`kinds` must name at least one event kind (leave it out for all)".into(),
                ))
            }
            Some(kinds) => Some(
                kinds
                    .iter()
                    .map(|kind| {
                        KINDS
                            .iter()
                            .copied()
                            .find(|known| known == kind)
                            .ok_or_else(|| {
                                SandboxError::InvalidRequest(format!(
                                    "unknown event kind `{}`; the kinds are {}",
                                    bounded(kind),
                                    KINDS.join(", ")
                                ))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let sandbox_id = config
            .sandbox_id
            .as_deref()
            .map(crate::request::sandbox_id)
            .transpose()?;
        Ok(Self { kinds, sandbox_id })
    }

    fn matches(&self, event: &Event) -> bool {
        self.kinds
            .as_ref()
            .is_none_or(|kinds| kinds.contains(&event.kind))
            && self
                .sandbox_id
                .is_none_or(|wanted| event.sandbox_id == Some(wanted))
    }
}

struct Subscriber {
    /// Which registration this is: a delivery task removes only its own.
    generation: u64,
    function_id: String,
    filter: Filter,
    queue: mpsc::Sender<Arc<Value>>,
    task: tokio::task::JoinHandle<()>,
}

/// The subscribers, shared with their delivery tasks (which drop a dead one).
struct Table {
    /// How many subscribers there are: what an emit with none looks at.
    count: AtomicUsize,
    subscribers: Mutex<HashMap<String, Subscriber>>,
    generations: AtomicU64,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Subscriber>> {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes subscriber `id` if it is still registration `generation`.
    fn drop_dead(&self, id: &str, generation: u64) -> bool {
        let mut subscribers = self.lock();
        if subscribers
            .get(id)
            .is_none_or(|s| s.generation != generation)
        {
            return false;
        }
        subscribers.remove(id);
        self.count.store(subscribers.len(), Ordering::Relaxed);
        true
    }
}

/// The subscribers and their delivery.
pub struct Events {
    table: Arc<Table>,
    deliver: Arc<dyn Deliver>,
    dead_after: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeRequest {
    id: String,
    function_id: String,
    #[serde(default)]
    config: Value,
    /// The trigger type the binding named (ours or the family's): both feed the same events.
    #[serde(default)]
    trigger_type: Option<String>,
    /// The prefix our functions are served under on the bus.
    #[serde(default)]
    prefix: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeRequest {
    id: String,
}

impl Events {
    pub fn new(deliver: Arc<dyn Deliver>) -> Self {
        Self::with_dead_after(deliver, DEAD_AFTER)
    }

    fn with_dead_after(deliver: Arc<dyn Deliver>, dead_after: Duration) -> Self {
        Self {
            table: Arc::new(Table {
                count: AtomicUsize::new(0),
                subscribers: Mutex::new(HashMap::new()),
                generations: AtomicU64::new(0),
            }),
            deliver,
            dead_after,
        }
    }

    /// Whether anyone listens (one atomic load).
    #[inline]
    pub fn active(&self) -> bool {
        self.table.count.load(Ordering::Relaxed) != 0
    }

    /// Emits the event `make` builds; `make` runs only when someone listens.
    #[inline]
    pub fn emit(&self, make: impl FnOnce() -> Event) {
        if self.active() {
            self.send(make());
        }
    }

    /// Runs an exec (`run`) between its `exec_started` and `exec_ended` events.
    pub async fn exec<F>(&self, sandbox_id: Uuid, run: F) -> Result<Value, SandboxError>
    where
        F: Future<Output = Result<Value, SandboxError>>,
    {
        if !self.active() {
            return run.await;
        }
        let started = Instant::now();
        self.send(Event::new("exec_started", Some(sandbox_id)));
        let result = run.await;
        self.emit(|| Event::exec_ended(sandbox_id, started, &result));
        result
    }

    fn send(&self, event: Event) {
        let mut subscribers = self.lock();
        let mut json: Option<Arc<Value>> = None;
        let mut full = Vec::new();
        for (id, subscriber) in subscribers.iter() {
            if !subscriber.filter.matches(&event) {
                continue;
            }
            let json = json.get_or_insert_with(|| Arc::new(event.to_json()));
            match subscriber.queue.try_send(Arc::clone(json)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => full.push(id.clone()),
                // Its task ended (the runtime is going away): nothing to deliver to.
                Err(mpsc::error::TrySendError::Closed(_)) => full.push(id.clone()),
            }
        }
        for id in full {
            if let Some(dropped) = subscribers.remove(&id) {
                dropped.task.abort();
                self.table.count.store(subscribers.len(), Ordering::Relaxed);
                tracing::warn!(
                    trigger_id = %id,
                    function_id = %dropped.function_id,
                    queue = QUEUE,
                    "an event subscriber does not keep up (its queue is full): dropped; it gets \
                     no more events until it registers again"
                );
            }
        }
    }

    /// `events::subscribe {id, function_id, config, trigger_type?}` from the shell.
    pub fn subscribe(&self, payload: Value) -> Result<Value, SandboxError> {
        let request: SubscribeRequest = crate::request::parse(payload)?;
        for (field, value) in [("id", &request.id), ("function_id", &request.function_id)] {
            if value.is_empty() || value.len() > MAX_ID {
                return Err(SandboxError::InvalidRequest(format!(
                    "the event trigger's `{field}` must be 1 to {MAX_ID} bytes"
                )));
            }
        }
        let own = request.prefix.as_deref().map(|p| format!("{p}::"));
        if let Some(reserved) = RESERVED
            .iter()
            .copied()
            .chain(own.as_deref())
            .find(|reserved| request.function_id.starts_with(reserved))
        {
            return Err(SandboxError::InvalidRequest(format!(
                "events are not delivered to `{reserved}*` functions (the adapter's own, the \
                 sandbox family's or the engine's); bind a function of your worker"
            )));
        }
        let filter = Filter::parse(request.config)?;
        let mut subscribers = self.lock();
        if let Some(existing) = subscribers.get(&request.id) {
            // The engine replays bindings after a reconnect: the same binding keeps its queue.
            if existing.function_id == request.function_id && existing.filter == filter {
                return Ok(json!({"subscribed": true}));
            }
        }
        if !subscribers.contains_key(&request.id) && subscribers.len() >= MAX_SUBSCRIBERS {
            return Err(SandboxError::ResourceLimit(format!(
                "the adapter has {MAX_SUBSCRIBERS} event subscribers, its limit"
            )));
        }
        let (queue, events) = mpsc::channel(QUEUE);
        let generation = self.table.generations.fetch_add(1, Ordering::Relaxed);
        let task = tokio::spawn(deliver_all(
            Delivery {
                table: Arc::downgrade(&self.table),
                id: request.id.clone(),
                generation,
                function_id: request.function_id.clone(),
                deliver: Arc::clone(&self.deliver),
                dead_after: self.dead_after,
            },
            events,
        ));
        tracing::info!(
            trigger_id = %request.id,
            function_id = %request.function_id,
            trigger_type = request.trigger_type.as_deref().unwrap_or(""),
            "event subscriber registered"
        );
        let subscriber = Subscriber {
            generation,
            function_id: request.function_id,
            filter,
            queue,
            task,
        };
        if let Some(old) = subscribers.insert(request.id, subscriber) {
            old.task.abort();
        }
        self.table.count.store(subscribers.len(), Ordering::Relaxed);
        Ok(json!({"subscribed": true}))
    }

    /// `events::unsubscribe {id}` from the shell; an unknown id (one dropped earlier) is fine.
    pub fn unsubscribe(&self, payload: Value) -> Result<Value, SandboxError> {
        let request: UnsubscribeRequest = crate::request::parse(payload)?;
        let mut subscribers = self.lock();
        let removed = subscribers.remove(&request.id);
        self.table.count.store(subscribers.len(), Ordering::Relaxed);
        drop(subscribers);
        if let Some(removed) = &removed {
            removed.task.abort();
            tracing::info!(trigger_id = %request.id, "event subscriber unregistered");
        }
        Ok(json!({"unsubscribed": removed.is_some()}))
    }

    /// How many subscribers there are.
    pub fn subscribers(&self) -> usize {
        self.table.count.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Subscriber>> {
        self.table.lock()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        for subscriber in self.lock().values() {
            subscriber.task.abort();
        }
    }
}

/// What one subscriber's delivery task needs.
struct Delivery {
    table: std::sync::Weak<Table>,
    id: String,
    generation: u64,
    function_id: String,
    deliver: Arc<dyn Deliver>,
    dead_after: Duration,
}

/// One subscriber's delivery: in order, one at a time, each bounded by [`DELIVERY_TIMEOUT`];
/// ends when the subscriber is dropped, or drops it once it has been dead for `dead_after`.
async fn deliver_all(delivery: Delivery, mut events: mpsc::Receiver<Arc<Value>>) {
    let function_id = &delivery.function_id;
    let mut failures: u32 = 0;
    let mut failing_since: Option<Instant> = None;
    while let Some(event) = events.recv().await {
        let outcome = tokio::time::timeout(
            DELIVERY_TIMEOUT,
            delivery.deliver.deliver(function_id, &event),
        )
        .await;
        let error = match outcome {
            Ok(Ok(())) => {
                failures = 0;
                failing_since = None;
                continue;
            }
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {} s", DELIVERY_TIMEOUT.as_secs()),
        };
        failures = failures.saturating_add(1);
        let since = *failing_since.get_or_insert_with(Instant::now);
        // The first failure says why; later ones would repeat it for every event.
        if failures == 1 {
            tracing::info!(%function_id, error = %bounded(&error), "an event did not reach its subscriber");
        } else {
            tracing::debug!(%function_id, error = %bounded(&error), failures, "an event did not reach its subscriber");
        }
        if failures >= DEAD_AFTER_FAILURES && since.elapsed() >= delivery.dead_after {
            let dropped = delivery
                .table
                .upgrade()
                .is_some_and(|table| table.drop_dead(&delivery.id, delivery.generation));
            if dropped {
                tracing::warn!(
                    trigger_id = %delivery.id,
                    %function_id,
                    failures,
                    error = %bounded(&error),
                    "an event subscriber has not been reached for {} s: dropped; it gets no \
                     more events until it registers again",
                    delivery.dead_after.as_secs()
                );
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<(String, Value)>>,
        /// Never answer (a subscriber that hangs).
        stall: AtomicBool,
    }

    impl Deliver for Arc<Recorder> {
        fn deliver(
            &self,
            function_id: &str,
            event: &Value,
        ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>> {
            self.seen
                .lock()
                .unwrap()
                .push((function_id.to_string(), event.clone()));
            let stall = self.stall.load(Ordering::SeqCst);
            Box::pin(async move {
                if stall {
                    std::future::pending::<()>().await;
                }
                Ok(())
            })
        }
    }

    fn hub() -> (Arc<Recorder>, Events) {
        let recorder = Arc::new(Recorder::default());
        let events = Events::new(Arc::new(Arc::clone(&recorder)));
        (recorder, events)
    }

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn events_reach_a_subscriber_in_order_with_kind_id_and_time() {
        let (recorder, events) = hub();
        let id = Uuid::new_v4();
        events.emit(|| unreachable!("no subscriber: nothing is built"));
        events
            .subscribe(json!({"id": "t1", "function_id": "app::on_event", "config": {}}))
            .unwrap();
        events.emit(|| Event::created(id, "alpine", 1, 256, false));
        events.emit(|| Event::ready(id));
        events.emit(|| Event::stopped(id, StopReason::Idle));
        settle().await;
        let seen = recorder.seen.lock().unwrap().clone();
        let kinds: Vec<&str> = seen
            .iter()
            .map(|(_, e)| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["created", "ready", "stopped"]);
        assert!(seen.iter().all(|(f, _)| f == "app::on_event"));
        assert_eq!(seen[2].1["reason"], "idle");
        assert_eq!(seen[0].1["sandbox_id"], id.to_string());
        let at = seen[0].1["at"].as_str().unwrap();
        assert!(chrono::DateTime::parse_from_rfc3339(at).is_ok(), "{at}");
        assert_eq!(at.len(), "2026-01-01T00:00:00.000Z".len(), "{at}");
    }

    #[tokio::test]
    async fn filters_by_kind_and_sandbox() {
        let (recorder, events) = hub();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let config = json!({"kinds": ["stopped"], "sandbox_id": a.to_string()});
        events
            .subscribe(json!({"id": "t1", "function_id": "f", "config": config}))
            .unwrap();
        events.emit(|| Event::ready(a));
        events.emit(|| Event::stopped(b, StopReason::Caller));
        events.emit(|| Event::stopped(a, StopReason::Caller));
        events.emit(|| Event::worker_started("vm", "img"));
        settle().await;
        let seen = recorder.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].1["sandbox_id"], a.to_string());
    }

    #[tokio::test]
    async fn bad_configs_are_refused_with_s001() {
        let (_, events) = hub();
        for config in [
            json!({"kinds": ["nope"]}),
            json!({"kinds": []}),
            json!({"kinds": "stopped"}),
            json!({"sandbox_id": "not-a-uuid"}),
            json!({"other": 1}),
            json!([1]),
            json!("x"),
        ] {
            let refused = events
                .subscribe(json!({"id": "t", "function_id": "f", "config": config}))
                .unwrap_err();
            assert_eq!(refused.code(), "S001", "{config}: {refused}");
        }
        for function_id in [
            "sandbox-libkrun::create",
            "sandbox::create",
            "sandbox::provider::libkrun::create",
            "engine::workers::register",
            "configuration::set",
        ] {
            let refused = events
                .subscribe(
                    json!({"id": "t", "function_id": function_id, "prefix": "sandbox-libkrun"}),
                )
                .unwrap_err();
            assert_eq!(refused.code(), "S001", "{function_id}: {refused}");
        }
        let long = "x".repeat(MAX_ID + 1);
        assert!(events
            .subscribe(json!({"id": long, "function_id": "f"}))
            .is_err());
        assert_eq!(events.subscribers(), 0);
        assert!(!events.active());
    }

    #[tokio::test]
    async fn a_subscriber_that_does_not_keep_up_is_dropped_and_nothing_waits() {
        let (recorder, events) = hub();
        recorder.stall.store(true, Ordering::SeqCst);
        events
            .subscribe(json!({"id": "slow", "function_id": "f"}))
            .unwrap();
        let id = Uuid::new_v4();
        let started = Instant::now();
        // One in flight, QUEUE waiting, then the one that does not fit.
        for _ in 0..QUEUE + 2 {
            events.emit(|| Event::ready(id));
            settle().await;
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(events.subscribers(), 0, "dropped");
        assert!(!events.active());
        // A new registration of the same binding starts afresh.
        recorder.stall.store(false, Ordering::SeqCst);
        events
            .subscribe(json!({"id": "slow", "function_id": "f"}))
            .unwrap();
        assert!(events.active());
    }

    #[tokio::test]
    async fn replayed_bindings_keep_their_queue_and_unsubscribe_ends_delivery() {
        let (recorder, events) = hub();
        let binding = json!({"id": "t1", "function_id": "f", "config": {"kinds": ["ready"]}});
        events.subscribe(binding.clone()).unwrap();
        events.subscribe(binding).unwrap();
        assert_eq!(events.subscribers(), 1);
        assert_eq!(
            events.unsubscribe(json!({"id": "t1"})).unwrap()["unsubscribed"],
            true
        );
        assert_eq!(
            events.unsubscribe(json!({"id": "t1"})).unwrap()["unsubscribed"],
            false
        );
        events.emit(|| Event::ready(Uuid::new_v4()));
        settle().await;
        assert!(recorder.seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn exec_events_carry_codes_and_times_never_output() {
        let (recorder, events) = hub();
        events
            .subscribe(json!({"id": "t", "function_id": "f"}))
            .unwrap();
        let id = Uuid::new_v4();
        let result = events
            .exec(id, async {
                Ok(json!({"exit_code": 3, "stdout": "SECRET-OUT", "stderr": ""}))
            })
            .await;
        assert_eq!(result.unwrap()["stdout"], "SECRET-OUT");
        let timed_out = events
            .exec(id, async {
                Err(SandboxError::ExecTimedOut {
                    timeout_ms: 5,
                    partial: json!({"exit_code": -1, "stdout": "SECRET-OUT"}),
                })
            })
            .await;
        assert!(timed_out.is_err());
        settle().await;
        let seen = recorder.seen.lock().unwrap().clone();
        let kinds: Vec<&str> = seen
            .iter()
            .map(|(_, e)| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["exec_started", "exec_ended", "exec_started", "exec_ended"]
        );
        assert_eq!(seen[1].1["exit_code"], 3);
        assert_eq!(seen[1].1["timed_out"], false);
        assert_eq!(seen[1].1["cancelled"], false);
        assert!(seen[1].1["duration_ms"].is_u64());
        assert_eq!(seen[3].1["timed_out"], true);
        let text = serde_json::to_string(&seen).unwrap();
        assert!(!text.contains("SECRET"), "{text}");
    }

    #[test]
    fn an_emit_with_no_subscriber_costs_an_atomic_load() {
        let (_, events) = hub();
        let id = Uuid::new_v4();
        let n = 10_000_000u32;
        let started = Instant::now();
        for _ in 0..n {
            events.emit(|| Event::ready(std::hint::black_box(id)));
        }
        let per = started.elapsed().as_secs_f64() * 1e9 / f64::from(n);
        println!("bench events_emit_no_subscriber ns_per_emit={per:.2}");
        // Generous for a debug build on a shared machine; building an event costs far more.
        assert!(per < 50.0, "{per} ns per emit");
    }

    #[tokio::test]
    async fn a_subscriber_that_is_never_reached_is_dropped() {
        struct Gone;
        impl Deliver for Gone {
            fn deliver(
                &self,
                function_id: &str,
                _: &Value,
            ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>> {
                let error = format!("function_not_found: {function_id}");
                Box::pin(async move { Err(error) })
            }
        }
        let events = Events::with_dead_after(Arc::new(Gone), Duration::from_millis(100));
        events
            .subscribe(json!({"id": "gone", "function_id": "f"}))
            .unwrap();
        let id = Uuid::new_v4();
        for _ in 0..DEAD_AFTER_FAILURES {
            events.emit(|| Event::ready(id));
            settle().await;
        }
        assert!(events.active(), "failures alone, not yet for long: kept");
        tokio::time::sleep(Duration::from_millis(150)).await;
        events.emit(|| Event::ready(id));
        settle().await;
        assert!(!events.active(), "dead for longer than dead_after: dropped");
        // A later registration of the same binding is a new subscriber.
        events
            .subscribe(json!({"id": "gone", "function_id": "f"}))
            .unwrap();
        assert_eq!(events.subscribers(), 1);
    }

    #[test]
    fn long_text_is_cut() {
        let cause = "x".repeat(10_000);
        let event = Event::agent_lost(Uuid::new_v4(), &cause).to_json();
        assert!(event["cause"].as_str().unwrap().chars().count() <= MAX_TEXT + 1);
        assert_eq!(event["reason"], "agent_lost");
    }
}
