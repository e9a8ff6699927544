//! The connection to the engine once start-up has finished: kept, and replaced when the
//! engine refuses it, while the plugin (its sandboxes and worker VMs) runs on untouched.
//!
//! A lost link is the SDK's own business: the same client reconnects every 2 s, presents its
//! previous identity (`reattach`) and registers everything again; we only watch and report it.
//! A refusal (`registrationrejected` with `WORKER_NAMESPACE_CONFLICT`, or a code the SDK does
//! not know) stops a client for good: it never connects again and cannot be started again. So
//! the shell builds a new client under our worker name, with backoff (0.5 s doubling to 30 s),
//! and registers every function on it once the engine has accepted the name.
//!
//! While the engine keeps refusing our name (another live worker holds it), a *standby*
//! connection, announced under a name of its own (`<name>-standby-<random>`, so nobody can
//! hold it in advance), serves our functions in the same namespace: callers address
//! functions, not workers. Our name is tried again only once the standby no longer sees the
//! holder in `engine::workers::list` (or cannot tell), so a lasting conflict costs one list
//! call per try, not a refused connection. Once a try under our own name is accepted, the
//! standby withdraws its functions, waits until the engine has handled that, and closes; the
//! functions are then registered under our name again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use iii_sdk::protocol::TriggerRequest;
use iii_sdk::runtime::{FunctionRef, IIIConnectionState, WorkerMetadata};
use iii_sdk::{IIIClient, InitOptions};
use plugin_api::FunctionSpec;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::serve::{register_all, Dispatcher};
use crate::services::EngineServices;

/// The engine's code for a worker name another live worker holds in the namespace.
pub const NAME_CONFLICT: &str = "WORKER_NAMESPACE_CONFLICT";
/// First wait before a new client after a refusal; doubles after each failed try.
pub const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between tries.
pub const MAX_RETRY: Duration = Duration::from_secs(30);
/// At most one warning per this while the engine keeps refusing our name.
pub const WARN_EVERY: Duration = Duration::from_secs(60);
/// How often the current client's state is looked at.
const POLL: Duration = Duration::from_millis(250);
/// How long a new client may take to be greeted by the engine.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the engine may take to answer the call that orders our messages.
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(5);
/// Answered by every engine, and cheap: the call whose reply tells us the engine has handled
/// everything we sent before it on the same connection (it handles them in order).
const ROUND_TRIP_FUNCTION: &str = "engine::workers::list";

/// Makes a client that connects at once (in the SDK's own thread) and announces `name`.
pub fn connect(url: &str, name: &str, namespace: Option<&str>, version: &str) -> IIIClient {
    let metadata = WorkerMetadata {
        name: name.to_string(),
        version: version.to_string(),
        description: Some("Runs code sandboxes and worker VMs".into()),
        namespace: namespace.map(str::to_string),
        ..WorkerMetadata::default()
    };
    let options = InitOptions {
        metadata: Some(metadata),
        namespace: namespace.map(str::to_string),
        // Our own arguments already took III_WORKER_NAME / III_NAMESPACE into account.
        identity: iii_sdk::WorkerIdentityMode::Explicit,
        ..InitOptions::default()
    };
    iii_sdk::register_worker(url, options)
}

/// Doubling waits between `first` and `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The wait before the next try; the one after it is twice as long, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to `first`, after a success.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// Lets something happen at most once per `every`.
#[derive(Debug, Clone)]
pub struct RateLimit {
    every: Duration,
    last: Option<Instant>,
}

impl RateLimit {
    pub fn new(every: Duration) -> Self {
        Self { every, last: None }
    }

    /// Whether it may happen at `now`; if so, the next time is `every` later.
    pub fn allow(&mut self, now: Instant) -> bool {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.every)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// Why the engine stopped a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The engine's code (`WORKER_NAMESPACE_CONFLICT`, ...), when it sent one.
    pub code: Option<String>,
    /// The worker that holds what we asked for.
    pub owner: Option<String>,
    pub message: String,
}

impl Refusal {
    pub fn from_error(error: &iii_sdk::Error) -> Self {
        match error {
            iii_sdk::Error::RegistrationRejected {
                code,
                owner_worker_id,
                ..
            } => Self {
                code: Some(code.clone()),
                owner: Some(owner_worker_id.clone()),
                message: error.to_string(),
            },
            other => Self {
                code: None,
                owner: None,
                message: other.to_string(),
            },
        }
    }

    pub fn is_name_conflict(&self) -> bool {
        self.code.as_deref() == Some(NAME_CONFLICT)
    }
}

/// What `adapter::info.bus.state` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusState {
    /// Serving under our worker name.
    Connected,
    /// No connection serves: the link was lost or the engine refused us for another reason.
    Reconnecting,
    /// The engine refuses our worker name; a standby connection serves meanwhile.
    NameConflict,
}

impl BusState {
    fn as_str(self) -> &'static str {
        match self {
            BusState::Connected => "connected",
            BusState::Reconnecting => "reconnecting",
            BusState::NameConflict => "name_conflict",
        }
    }
}

#[derive(Debug, Clone)]
struct Snapshot {
    state: BusState,
    code: Option<String>,
    message: Option<String>,
    held_by: Option<String>,
    serving_as: Option<String>,
    reconnects: u64,
    refusals: u64,
}

/// The connection's state as the plugin reports it, shared between the supervisor and
/// [`EngineServices`].
#[derive(Debug)]
pub struct BusStatus {
    worker_name: String,
    inner: Mutex<Snapshot>,
}

impl BusStatus {
    /// Connected: start-up has just registered every function under `worker_name`.
    pub fn new(worker_name: impl Into<String>) -> Self {
        Self {
            worker_name: worker_name.into(),
            inner: Mutex::new(Snapshot {
                state: BusState::Connected,
                code: None,
                message: None,
                held_by: None,
                serving_as: None,
                reconnects: 0,
                refusals: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn state(&self) -> BusState {
        self.lock().state
    }

    /// The SDK's view of our client's link; returns the new state when it changed. A link
    /// that comes back counts as a reconnect.
    pub fn link(&self, connected: bool) -> Option<BusState> {
        let mut s = self.lock();
        match (s.state, connected) {
            (BusState::Connected, false) => {
                s.state = BusState::Reconnecting;
                s.code = None;
                s.message = Some("the connection to the engine was lost; reconnecting".into());
                Some(BusState::Reconnecting)
            }
            (BusState::Reconnecting, true) => {
                Self::back(&mut s);
                Some(BusState::Connected)
            }
            _ => None,
        }
    }

    /// Serving under our name again, on a new client.
    pub fn regained(&self) {
        Self::back(&mut self.lock());
    }

    fn back(s: &mut Snapshot) {
        s.state = BusState::Connected;
        s.code = None;
        s.message = None;
        s.held_by = None;
        s.serving_as = None;
        s.reconnects += 1;
    }

    /// The engine refused a client of ours.
    pub fn refused(&self, refusal: &Refusal) {
        let mut s = self.lock();
        s.refusals += 1;
        s.state = if refusal.is_name_conflict() {
            BusState::NameConflict
        } else {
            BusState::Reconnecting
        };
        s.code = refusal.code.clone();
        s.message = Some(refusal.message.clone());
        s.held_by = refusal.owner.clone();
    }

    /// A try did not reach the engine. During a name conflict the state stays: the standby
    /// may still serve, and the name is still the question.
    pub fn unreachable(&self, reason: &str) {
        let mut s = self.lock();
        if s.state != BusState::NameConflict {
            s.state = BusState::Reconnecting;
            s.code = None;
            s.message = Some(reason.to_string());
        }
    }

    /// The standby connection's worker name while it serves, `None` once it no longer does.
    pub fn serving_as(&self, name: Option<String>) {
        self.lock().serving_as = name;
    }

    /// `adapter::info.bus`.
    pub fn to_json(&self) -> Value {
        let s = self.lock().clone();
        let mut out = json!({
            "state": s.state.as_str(),
            "worker_name": self.worker_name,
            "reconnects": s.reconnects,
            "refusals": s.refusals,
        });
        for (key, value) in [
            ("code", s.code),
            ("message", s.message),
            ("held_by", s.held_by),
            ("serving_as", s.serving_as),
        ] {
            if let Some(value) = value {
                out[key] = Value::String(value);
            }
        }
        out
    }
}

/// Everything needed to serve the plugin's functions on a new client.
pub struct Connector {
    pub url: String,
    pub worker_name: String,
    pub namespace: Option<String>,
    pub version: String,
    pub prefix: String,
    pub functions: Vec<FunctionSpec>,
    pub dispatcher: Arc<Dispatcher>,
}

impl Connector {
    fn client(&self, name: &str) -> IIIClient {
        connect(&self.url, name, self.namespace.as_deref(), &self.version)
    }

    fn register(&self, iii: &IIIClient) -> Vec<FunctionRef> {
        register_all(
            iii,
            &self.prefix,
            &self.functions,
            Arc::clone(&self.dispatcher),
        )
    }
}

/// A connection serving our functions under another name while ours is refused.
struct Standby {
    client: IIIClient,
    name: String,
    functions: Vec<FunctionRef>,
}

impl Standby {
    fn start(connector: &Connector) -> Self {
        let name = standby_name(&connector.worker_name);
        let client = connector.client(&name);
        let functions = connector.register(&client);
        tracing::warn!(standby = %name, "serving the functions from a standby connection meanwhile");
        Self {
            client,
            name,
            functions,
        }
    }

    /// Withdraws the functions, waits until the engine has handled that, and closes: the
    /// functions are then free for our own name (registering them first would only get them
    /// refused as held by the standby).
    async fn retire(self) {
        for function in &self.functions {
            function.unregister();
        }
        if let Err(e) = round_trip(&self.client).await {
            tracing::debug!(error = %e, "standby: no answer after withdrawing its functions");
        }
        self.client.shutdown_async().await;
    }
}

/// `<name>-standby-<8 hex digits>`, the digits from the process's random hash keys: not
/// guessable ahead, so nobody can hold the standby's name before it asks.
fn standby_name(worker_name: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{worker_name}-standby-{:08x}", hasher.finish() as u32)
}

/// One call and its reply on `iii`: everything sent before it has been handled by then.
async fn round_trip(iii: &IIIClient) -> Result<Value, iii_sdk::Error> {
    let request = TriggerRequest {
        function_id: ROUND_TRIP_FUNCTION.into(),
        payload: json!({}),
        action: None,
        timeout_ms: Some(ROUND_TRIP_TIMEOUT.as_millis() as u64),
    };
    iii.trigger(request).await
}

/// Why a try under our name did not give us a client.
enum TryFailed {
    Refused(Refusal),
    Unreachable(String),
}

/// A new client under our name, without functions, kept only if the engine accepts the
/// name: its announcement goes out before the round-trip call, so a refusal of the name has
/// arrived by the time that call is answered.
async fn try_our_name(connector: &Connector) -> Result<IIIClient, TryFailed> {
    let client = connector.client(&connector.worker_name);
    let outcome = async {
        if let Err(e) = client.wait_until_registered(REGISTER_TIMEOUT).await {
            let rejected = matches!(e, iii_sdk::Error::RegistrationRejected { .. });
            return Err(match client.fatal_error() {
                Some(fatal) => TryFailed::Refused(Refusal::from_error(&fatal)),
                None if rejected => TryFailed::Refused(Refusal::from_error(&e)),
                // Timed out or stopped: no answer either way.
                None => TryFailed::Unreachable(format!("cannot register with the engine: {e}")),
            });
        }
        let answer = round_trip(&client).await;
        if let Some(fatal) = client.fatal_error() {
            return Err(TryFailed::Refused(Refusal::from_error(&fatal)));
        }
        answer
            .map(|_| ())
            .map_err(|e| TryFailed::Unreachable(format!("no answer from the engine: {e}")))
    }
    .await;
    match outcome {
        Ok(()) => Ok(client),
        Err(failed) => {
            client.shutdown_async().await;
            Err(failed)
        }
    }
}

/// Keeps the plugin's functions on the bus for as long as the process runs, starting from
/// `primary` (registered by start-up). Never returns: the caller stops it on a signal.
pub async fn keep_connected(
    connector: Connector,
    services: Arc<EngineServices>,
    primary: IIIClient,
) {
    let mut primary = primary;
    let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
    loop {
        let fatal = watch(&primary, &services.status).await;
        let refusal = Refusal::from_error(&fatal);
        tracing::error!(
            reason = %refusal.message,
            "the engine refused this worker's connection; every sandbox and worker VM keeps \
             running, and the shell connects again"
        );
        primary.shutdown_async().await;
        primary = recover(&connector, &services, refusal, &mut backoff).await;
        backoff.reset();
    }
}

/// Follows the SDK's reconnects of `primary` until the engine stops it for good.
async fn watch(primary: &IIIClient, status: &BusStatus) -> iii_sdk::Error {
    let mut poll = tokio::time::interval(POLL);
    loop {
        poll.tick().await;
        if let Some(fatal) = primary.fatal_error() {
            return fatal;
        }
        let connected = primary.get_connection_state() == IIIConnectionState::Connected;
        match status.link(connected) {
            Some(BusState::Reconnecting) => {
                tracing::warn!("lost the connection to the engine; the SDK reconnects")
            }
            Some(BusState::Connected) => tracing::info!("connected to the engine again"),
            _ => {}
        }
    }
}

/// Tries our name with backoff until the engine accepts it, a standby serving while it is
/// held elsewhere; returns the new client with every function registered on it.
async fn recover(
    connector: &Connector,
    services: &EngineServices,
    first: Refusal,
    backoff: &mut Backoff,
) -> IIIClient {
    let mut standby: Option<Standby> = None;
    let mut warn = RateLimit::new(WARN_EVERY);
    // The error just logged stands for this minute's warning.
    warn.allow(Instant::now());
    let mut failed = TryFailed::Refused(first);
    record(&services.status, &failed);
    let mut tries: u64 = 0;
    loop {
        if let Some(current) = standby.take() {
            match current.client.fatal_error() {
                Some(fatal) => {
                    tracing::warn!(standby = %current.name, error = %fatal, "the engine refused the standby connection");
                    current.client.shutdown_async().await;
                    services.status.serving_as(None);
                }
                None => standby = Some(current),
            }
        }
        if services.status.state() == BusState::NameConflict && standby.is_none() {
            let started = Standby::start(connector);
            services.replace(started.client.clone());
            services.status.serving_as(Some(started.name.clone()));
            standby = Some(started);
        }

        let delay = backoff.next_delay();
        match &failed {
            TryFailed::Refused(refusal) if refusal.is_name_conflict() => {
                if tries > 0 && warn.allow(Instant::now()) {
                    tracing::warn!(
                        worker = %connector.worker_name,
                        held_by = refusal.owner.as_deref().unwrap_or("?"),
                        tries,
                        standby = standby.as_ref().map_or("none", |s| s.name.as_str()),
                        next_try_in = ?delay,
                        "our worker name is still held by another live worker; the standby serves meanwhile"
                    );
                } else {
                    tracing::debug!(reason = %refusal.message, next_try_in = ?delay, "name still refused");
                }
            }
            TryFailed::Refused(refusal) if tries > 0 => {
                tracing::info!(reason = %refusal.message, next_try_in = ?delay, "refused again");
            }
            TryFailed::Refused(_) => {
                tracing::info!(next_try_in = ?delay, "connecting again");
            }
            TryFailed::Unreachable(reason) => {
                tracing::info!(%reason, next_try_in = ?delay, "cannot reach the engine yet");
            }
        }
        tokio::time::sleep(delay).await;
        tries += 1;
        if let Some(holder) = still_held(&failed, standby.as_ref()).await {
            tracing::debug!(%holder, "the worker holding our name is still connected; not trying yet");
            continue;
        }
        match try_our_name(connector).await {
            Ok(client) => {
                if let Some(standby) = standby.take() {
                    standby.retire().await;
                }
                connector.register(&client);
                services.replace(client.clone());
                services.status.regained();
                tracing::info!(
                    worker = %connector.worker_name,
                    tries,
                    "serving under our worker name again"
                );
                return client;
            }
            Err(next) => {
                record(&services.status, &next);
                failed = next;
            }
        }
    }
}

fn record(status: &BusStatus, failed: &TryFailed) {
    match failed {
        TryFailed::Refused(refusal) => status.refused(refusal),
        TryFailed::Unreachable(reason) => status.unreachable(reason),
    }
}

/// The worker that holds our name, when the standby still sees it connected: trying our name
/// then would only be refused again (a connection and an SDK error line for nothing). `None`
/// (try) without a standby, without a holder, or when the list cannot be read.
async fn still_held(failed: &TryFailed, standby: Option<&Standby>) -> Option<String> {
    let TryFailed::Refused(refusal) = failed else {
        return None;
    };
    let holder = refusal
        .owner
        .as_deref()
        .filter(|_| refusal.is_name_conflict())?;
    let list = round_trip(&standby?.client).await.ok()?;
    lists_worker(&list, holder).then(|| holder.to_string())
}

/// Whether an `engine::workers::list` answer has a worker with id `id`.
fn lists_worker(list: &Value, id: &str) -> bool {
    list["workers"]
        .as_array()
        .is_some_and(|workers| workers.iter().any(|worker| worker["id"] == id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_half_a_second_to_thirty_and_starts_over_after_a_success() {
        let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
        let waits: Vec<u64> = (0..10)
            .map(|_| backoff.next_delay().as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]
        );
        backoff.reset();
        assert_eq!(backoff.next_delay(), FIRST_RETRY);
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn the_rate_limit_allows_once_per_period_never_more() {
        let start = Instant::now();
        let mut limit = RateLimit::new(WARN_EVERY);
        assert!(limit.allow(start));
        assert!(!limit.allow(start));
        assert!(!limit.allow(start + Duration::from_secs(59)));
        assert!(limit.allow(start + Duration::from_secs(60)));
        assert!(!limit.allow(start + Duration::from_secs(119)));
        assert!(limit.allow(start + Duration::from_secs(125)));
    }

    fn conflict() -> Refusal {
        Refusal::from_error(&iii_sdk::Error::RegistrationRejected {
            code: NAME_CONFLICT.into(),
            namespace: "default".into(),
            worker_name: Some("sandbox-libkrun".into()),
            function_id: None,
            owner_worker_id: "w-1".into(),
        })
    }

    #[test]
    fn a_refusal_is_a_name_conflict_only_for_the_engines_name_code() {
        let refusal = conflict();
        assert!(refusal.is_name_conflict());
        assert_eq!(refusal.owner.as_deref(), Some("w-1"));
        assert!(
            refusal.message.contains(NAME_CONFLICT),
            "{}",
            refusal.message
        );
        let other = Refusal::from_error(&iii_sdk::Error::RegistrationRejected {
            code: "SOMETHING_NEW".into(),
            namespace: "default".into(),
            worker_name: None,
            function_id: None,
            owner_worker_id: "w-2".into(),
        });
        assert!(!other.is_name_conflict());
        let timeout = Refusal::from_error(&iii_sdk::Error::Timeout);
        assert!(!timeout.is_name_conflict());
        assert_eq!(timeout.code, None);
    }

    #[test]
    fn a_lost_link_and_its_return_count_one_reconnect() {
        let status = BusStatus::new("sandbox-libkrun");
        assert_eq!(status.link(true), None);
        assert_eq!(status.link(false), Some(BusState::Reconnecting));
        assert_eq!(status.link(false), None);
        let info = status.to_json();
        assert_eq!(info["state"], "reconnecting", "{info}");
        assert!(info["message"].is_string(), "{info}");
        assert_eq!(status.link(true), Some(BusState::Connected));
        let info = status.to_json();
        assert_eq!(info["state"], "connected", "{info}");
        assert_eq!(info["reconnects"], 1, "{info}");
        assert!(info.get("message").is_none(), "{info}");
    }

    #[test]
    fn a_name_conflict_is_reported_until_the_name_is_regained() {
        let status = BusStatus::new("sandbox-libkrun");
        status.refused(&conflict());
        status.serving_as(Some("sandbox-libkrun-standby-0000abcd".into()));
        // Neither the SDK's link nor an unreachable try hides the conflict.
        assert_eq!(status.link(true), None);
        status.unreachable("cannot register with the engine: invocation timed out");
        let info = status.to_json();
        assert_eq!(info["state"], "name_conflict", "{info}");
        assert_eq!(info["code"], NAME_CONFLICT, "{info}");
        assert_eq!(info["held_by"], "w-1", "{info}");
        assert_eq!(
            info["serving_as"], "sandbox-libkrun-standby-0000abcd",
            "{info}"
        );
        assert_eq!(info["worker_name"], "sandbox-libkrun", "{info}");
        assert_eq!(info["refusals"], 1, "{info}");
        assert_eq!(info["reconnects"], 0, "{info}");

        status.regained();
        let info = status.to_json();
        assert_eq!(info["state"], "connected", "{info}");
        assert_eq!(info["reconnects"], 1, "{info}");
        assert_eq!(info["refusals"], 1, "{info}");
        for gone in ["code", "message", "held_by", "serving_as"] {
            assert!(info.get(gone).is_none(), "{gone}: {info}");
        }
    }

    #[test]
    fn another_refusal_is_reconnecting_and_an_unreachable_engine_says_why() {
        let status = BusStatus::new("w");
        status.refused(&Refusal::from_error(
            &iii_sdk::Error::RegistrationRejected {
                code: "SOMETHING_NEW".into(),
                namespace: "default".into(),
                worker_name: None,
                function_id: None,
                owner_worker_id: "w-2".into(),
            },
        ));
        let info = status.to_json();
        assert_eq!(info["state"], "reconnecting", "{info}");
        assert_eq!(info["code"], "SOMETHING_NEW", "{info}");
        status.unreachable("cannot register with the engine: invocation timed out");
        let info = status.to_json();
        assert_eq!(info["state"], "reconnecting", "{info}");
        assert!(info.get("code").is_none(), "{info}");
        assert_eq!(
            info["message"],
            "cannot register with the engine: invocation timed out"
        );
    }

    #[test]
    fn the_holder_counts_as_connected_only_when_the_list_names_its_id() {
        let list = json!({"workers": [
            {"id": "w-1", "name": "sandbox-libkrun"},
            {"id": "w-2", "name": "other"},
        ]});
        assert!(lists_worker(&list, "w-1"));
        assert!(!lists_worker(&list, "w-3"));
        // An answer of another shape proves nothing: try the name.
        assert!(!lists_worker(&json!({"items": [{"id": "w-1"}]}), "w-1"));
        assert!(!lists_worker(&json!([{"id": "w-1"}]), "w-1"));
    }

    #[test]
    fn standby_names_are_the_worker_name_and_eight_hex_digits() {
        let name = standby_name("sandbox-libkrun");
        let digits = name
            .strip_prefix("sandbox-libkrun-standby-")
            .unwrap_or_else(|| panic!("{name}"));
        assert_eq!(digits.len(), 8, "{name}");
        assert!(digits.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    }
}
