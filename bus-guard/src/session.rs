//! The judgment of one guest worker connection, message by message, free of sockets: what
//! goes on to the engine, what the guard answers itself, and when the connection must end.
//!
//! Every guest message is decoded into its typed form ([`crate::message`]), validated, and
//! what goes on is the guard's own serialisation of what it validated. A message that cannot
//! be decoded or breaks a rule of shape ends the connection with a logged reason; a refused
//! registration or call is answered as the SDKs understand (`registrationrejected`, an
//! `invocationresult` error) and the connection stays.
//!
//! Guest to engine: registrations (`sandbox_bus_register`; HTTP-invoked ones never from a
//! sandbox), calls (`sandbox_bus_call`, the SDKs' own `engine::workers::register`, rebuilt by
//! the guard, and `engine::channels::create`), the results of the calls the engine made to it,
//! `reattach`; in worker mode also triggers and trigger types. `ping` is answered here.
//! Engine to guest, rebuilt: the greeting (without `features`), calls to the guest's own
//! functions (without the caller's identity), the results of its calls, refusals (without
//! another worker's id), in worker mode the trigger messages. Everything else is dropped both
//! ways, as the protocol says unknown types are.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use uuid::Uuid;

use crate::limits::{ChannelCeiling, LogLine, Shared, CHANNEL_RATE, MAX_LIVE_CHANNELS};
use crate::message::{
    self, Announcement, ChannelRequest, EngineCall, FromEngine, Guest, HttpInvocation,
    InvokeFunction, Malformed, RegisterFunction, RegisterTrigger, RegisterTriggerType, Rejected,
    ToEngine,
};
use crate::name::{clean, BadText, Kind};
use crate::policy::{Policy, Refusal, WORKER_ANNOUNCEMENT};
use crate::wire;

/// Functions one connection may register.
pub const MAX_FUNCTIONS: usize = 256;
/// The guest's calls awaiting their results, per connection.
pub const MAX_CALLS_IN_FLIGHT: usize = 1024;
/// Calls to the guest awaiting its results, per connection.
pub const MAX_SERVING: usize = 4096;
/// The longest function id, worker name or other name judged, in characters.
pub const MAX_ID_LEN: usize = crate::name::MAX_NAME_CHARS;
/// Bytes of one registration's schemas, description, metadata and HTTP invocation (or one
/// trigger's configuration and metadata), as the guard serialises them: what the engine keeps
/// in memory for as long as the connection lives.
pub const MAX_REGISTRATION_BYTES: usize = 64 << 10;
/// Bytes of all registrations of one connection together.
pub const MAX_CONNECTION_REGISTRATION_BYTES: usize = 1 << 20;
/// Triggers one connection may bind (worker mode): each is engine state for the
/// connection's life, as a function is.
pub const MAX_TRIGGERS: usize = 256;
/// Trigger types one connection may provide (worker mode).
pub const MAX_TRIGGER_TYPES: usize = 32;
/// The largest `buffer_size` of a channel a guest creates.
pub const MAX_CHANNEL_BUFFER: u32 = 1024;
/// Bytes of a call's `metadata` sidecar.
pub const MAX_CALL_METADATA: usize = 64 << 10;
/// Bytes of `baggage` (W3C baggage allows 8192).
const MAX_BAGGAGE: usize = 8192;

/// The engine's channel function, rebuilt by the guard.
const CHANNEL_CREATE: &str = "engine::channels::create";
/// Features of the announcement relayed: the only one whose messages need nothing the guard
/// does not carry (the engine may send this worker messages up to 64 MiB).
const RELAYED_FEATURES: &[&str] = &["large-messages.v1"];

/// What a connection belongs to, shared by all of a sandbox's connections.
#[derive(Clone)]
pub(crate) struct Context {
    pub sandbox: Arc<str>,
    pub policy: Arc<Policy>,
    /// Functions the sandbox serves on the bus (all its connections).
    pub functions: Arc<AtomicUsize>,
    /// The sandbox's refusal log budget and channel budget.
    pub shared: Arc<Shared>,
}

impl Context {
    /// Logs one refusal within the sandbox's log budget: the sandbox id, the message type,
    /// the rule and (escaped, bounded) the id it concerned.
    pub fn log(&self, kind: &str, rule: &str, id: Option<&str>) {
        self.log_line(kind, rule, id, None);
    }

    /// Logs why a guest's connection is closed, within the same budget.
    pub fn log_malformed(&self, malformed: &Malformed) {
        self.log_line(
            malformed.kind,
            malformed.rule,
            None,
            malformed.detail.as_deref(),
        );
    }

    fn log_line(&self, kind: &str, rule: &str, id: Option<&str>, detail: Option<&str>) {
        let key = format!("{kind}: {rule}");
        let verdict = match self.shared.log.lock() {
            Ok(mut log) => log.note(&key, Instant::now()),
            Err(_) => LogLine::Quiet,
        };
        let id: Option<String> = id.map(|id| id.chars().take(MAX_ID_LEN).collect());
        match verdict {
            LogLine::Line => {
                tracing::warn!(sandbox_id = %self.sandbox, message_type = kind, rule, id = ?id, detail = ?detail, "bus guard refused a guest's message");
            }
            LogLine::Summary(count) => {
                tracing::warn!(sandbox_id = %self.sandbox, message_type = kind, rule, count, "bus guard: refusals of this rule not logged one by one since the last summary");
            }
            LogLine::Quiet => {}
        }
    }
}

/// What the relay does with a message.
#[derive(Debug)]
pub(crate) enum Out {
    Engine(Message),
    Guest(Message),
    /// End the connection (after what is already queued for the guest).
    Close,
}

pub(crate) struct Session {
    ctx: Context,
    /// Function ids registered through this connection and not refused, with the bytes
    /// each registration counts.
    served: HashMap<String, usize>,
    registration_bytes: usize,
    /// Calls the engine made to the guest, awaiting its result: the function each called.
    serving: HashMap<Uuid, String>,
    /// The guest's calls, awaiting the engine's result.
    calling: HashSet<Uuid>,
    /// Worker mode: triggers the guest bound (id -> bytes, type), trigger types it provides
    /// (id -> bytes).
    triggers: HashMap<String, (usize, String)>,
    trigger_types: HashMap<String, usize>,
    /// Worker mode: triggers the engine asked this guest (a provider) to bind: id -> (type,
    /// function).
    provided: HashMap<String, (String, String)>,
}

impl Session {
    pub fn new(ctx: Context) -> Session {
        Session {
            ctx,
            served: HashMap::new(),
            registration_bytes: 0,
            serving: HashMap::new(),
            calling: HashSet::new(),
            triggers: HashMap::new(),
            trigger_types: HashMap::new(),
            provided: HashMap::new(),
        }
    }

    /// Judges one data frame from the guest. `Err` ends the connection; the caller logs it.
    pub fn judge_guest(&mut self, message: &Message, out: &mut Vec<Out>) -> Result<(), Malformed> {
        let frame = payload(message).ok_or(Malformed::new("frame", "not a data frame"))?;
        match message::parse_guest(frame)? {
            Guest::RegisterFunction(registration) => self.register(registration, out),
            Guest::UnregisterFunction(u) => {
                if let Some(bytes) = self.served.remove(&u.id) {
                    self.registration_bytes -= bytes;
                    self.ctx.functions.fetch_sub(1, Ordering::Relaxed);
                    self.to_engine(out, ToEngine::UnregisterFunction(u));
                }
                Ok(())
            }
            Guest::InvokeFunction(call) => self.call(call, out),
            Guest::InvocationResult(mut result) => {
                let kind = message::INVOCATION_RESULT;
                // Only the answer to a call the engine made to this guest, under the id of
                // the function called.
                let Some(function) = self.serving.remove(&result.invocation_id) else {
                    return Ok(());
                };
                result.function_id = function;
                trace_fields(kind, &result.traceparent, &result.baggage)?;
                if let Some(error) = &result.error {
                    error_body(kind, error)?;
                }
                self.to_engine(out, ToEngine::InvocationResult(result));
                Ok(())
            }
            Guest::Ping => {
                out.push(Out::Guest(Message::text(wire::pong())));
                Ok(())
            }
            Guest::Pong | Guest::Other => Ok(()),
            Guest::Reattach(reattach) => {
                let kind = message::REATTACH;
                id_text(kind, &reattach.previous_worker_id)?;
                if let Some(token) = &reattach.reattach_token {
                    id_text(kind, token)?;
                }
                self.to_engine(out, ToEngine::Reattach(reattach));
                Ok(())
            }
            Guest::RegisterTriggerType(t) if self.ctx.policy.is_worker_vm() => {
                self.register_trigger_type(t, out)
            }
            Guest::UnregisterTriggerType(mut t) if self.ctx.policy.is_worker_vm() => {
                if let Some(bytes) = self.trigger_types.remove(&t.id) {
                    self.registration_bytes -= bytes;
                    t.description = None;
                    t.trigger_request_format = None;
                    t.call_request_format = None;
                    self.to_engine(out, ToEngine::UnregisterTriggerType(t));
                }
                Ok(())
            }
            Guest::RegisterTrigger(t) if self.ctx.policy.is_worker_vm() => {
                self.register_trigger(t, out)
            }
            Guest::UnregisterTrigger(mut t) if self.ctx.policy.is_worker_vm() => {
                if let Some((bytes, trigger_type)) = self.triggers.remove(&t.id) {
                    self.registration_bytes -= bytes;
                    t.trigger_type = Some(trigger_type);
                    t.message_type = None;
                    self.to_engine(out, ToEngine::UnregisterTrigger(t));
                }
                Ok(())
            }
            Guest::TriggerRegistrationResult(mut t) if self.ctx.policy.is_worker_vm() => {
                let kind = message::TRIGGER_REGISTRATION_RESULT;
                // Only the answer to a binding the engine asked this provider for.
                let Some((trigger_type, function)) = self.provided.get(&t.id) else {
                    return Ok(());
                };
                if *trigger_type != t.trigger_type {
                    return Ok(());
                }
                t.function_id = function.clone();
                t.result = None;
                t.message_type = None;
                if let Some(error) = &t.error {
                    error_body(kind, error)?;
                }
                self.to_engine(out, ToEngine::TriggerRegistrationResult(t));
                Ok(())
            }
            // Sandbox mode: triggers could bind any function to an HTTP route or a schedule.
            Guest::RegisterTriggerType(_)
            | Guest::UnregisterTriggerType(_)
            | Guest::RegisterTrigger(_)
            | Guest::UnregisterTrigger(_)
            | Guest::TriggerRegistrationResult(_) => Ok(()),
        }
    }

    /// Judges one data frame from the engine (trusted: what cannot be read is dropped).
    pub fn judge_engine(&mut self, message: &Message, out: &mut Vec<Out>) {
        let Some(frame) = payload(message) else {
            return;
        };
        let Some(parsed) = FromEngine::parse(frame) else {
            return;
        };
        match parsed {
            FromEngine::WorkerRegistered(_) => self.to_guest(out, &parsed),
            FromEngine::InvokeFunction(call) => self.engine_call(call, out),
            FromEngine::InvocationResult(ref result) => {
                if self.calling.remove(&result.invocation_id) {
                    self.to_guest(out, &parsed);
                }
            }
            FromEngine::RegistrationRejected(rejected) => {
                if let Some(id) = &rejected.function_id {
                    if let Some(bytes) = self.served.remove(id) {
                        self.registration_bytes -= bytes;
                        self.ctx.functions.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                // The engine names the worker that holds the id or name: never relayed.
                let rewritten = Rejected {
                    owner_worker_id: "another worker of the bus holds it (refused by the engine)"
                        .into(),
                    ..rejected
                };
                self.to_guest(out, &FromEngine::RegistrationRejected(rewritten));
            }
            FromEngine::RegisterTrigger(ref t) if self.ctx.policy.is_worker_vm() => {
                if self.trigger_types.contains_key(&t.trigger_type)
                    && self.provided.len() < MAX_SERVING
                {
                    self.provided.insert(
                        t.id.clone(),
                        (t.trigger_type.clone(), t.function_id.clone()),
                    );
                    self.to_guest(out, &parsed);
                }
            }
            FromEngine::UnregisterTrigger(ref t) if self.ctx.policy.is_worker_vm() => {
                if self.provided.remove(&t.id).is_some() {
                    self.to_guest(out, &parsed);
                }
            }
            FromEngine::TriggerRegistrationResult(ref t) if self.ctx.policy.is_worker_vm() => {
                if self.triggers.contains_key(&t.id) {
                    self.to_guest(out, &parsed);
                }
            }
            FromEngine::Ping => self.to_engine(out, ToEngine::Pong),
            FromEngine::RegisterTrigger(_)
            | FromEngine::UnregisterTrigger(_)
            | FromEngine::TriggerRegistrationResult(_)
            | FromEngine::Other => {}
        }
    }

    fn engine_call(&mut self, mut call: EngineCall, out: &mut Vec<Out>) {
        let function = call.function_id.clone();
        if !self.served.contains_key(&function) {
            // Never this guest's function: nothing of another reaches it.
            if let Some(id) = call.invocation_id {
                let refusal = Refusal::Limit {
                    what: format!("`{function}` is not served by this sandbox"),
                };
                out.push(Out::Engine(Message::text(wire::call_refused(
                    &id.to_string(),
                    &function,
                    &refusal,
                ))));
            }
            return;
        }
        // The caller's worker id, which the engine stamps into object data, stays with the
        // engine.
        if let Value::Object(data) = &mut call.data {
            data.remove("_caller_worker_id");
        }
        match call.invocation_id {
            Some(id) if self.serving.len() >= MAX_SERVING && !self.serving.contains_key(&id) => {
                let refusal = Refusal::Limit {
                    what: format!("the sandbox has {MAX_SERVING} calls to it awaiting an answer"),
                };
                out.push(Out::Engine(Message::text(wire::call_refused(
                    &id.to_string(),
                    &function,
                    &refusal,
                ))));
            }
            Some(id) => {
                self.serving.insert(id, function);
                self.to_guest(out, &FromEngine::InvokeFunction(call));
            }
            None => self.to_guest(out, &FromEngine::InvokeFunction(call)),
        }
    }

    fn register(
        &mut self,
        mut registration: RegisterFunction,
        out: &mut Vec<Out>,
    ) -> Result<(), Malformed> {
        let kind = message::REGISTER_FUNCTION;
        // Observe hooks are never relayed (the guard strips the engine's features).
        registration.observe = None;
        let raw_id = registration.id.clone();
        let verdict = self.check_registration(&mut registration);
        match verdict {
            Ok(bytes) => {
                let id = registration.id.clone();
                match self.served.insert(id, bytes) {
                    Some(before) => self.registration_bytes -= before,
                    None => {
                        self.ctx.functions.fetch_add(1, Ordering::Relaxed);
                    }
                }
                self.registration_bytes += bytes;
                self.to_engine(out, ToEngine::RegisterFunction(registration));
            }
            Err(refusal) => {
                self.ctx.log(kind, &refusal.rule(), Some(&raw_id));
                out.push(Out::Guest(Message::text(wire::function_rejected(
                    &raw_id, &refusal,
                ))));
            }
        }
        Ok(())
    }

    /// The bytes a registration counts, or why it is refused; its id and description are
    /// left in NFC.
    fn check_registration(&self, registration: &mut RegisterFunction) -> Result<usize, Refusal> {
        registration.id = name(&registration.id, Kind::Id, "function id")?;
        if let Some(description) = &registration.description {
            registration.description = Some(name(description, Kind::Text, "description")?);
        }
        if let Some(invocation) = &registration.invocation {
            self.check_http(invocation)?;
        }
        let bytes = registration.description.as_ref().map_or(0, String::len)
            + json_len(&registration.request_format)
            + json_len(&registration.response_format)
            + json_len(&registration.metadata)
            + registration
                .invocation
                .as_ref()
                .map_or(0, |i| serde_json::to_string(i).map_or(0, |s| s.len()));
        let before = self.served.get(&registration.id).copied();
        if before.is_none() && self.served.len() >= MAX_FUNCTIONS {
            return Err(Refusal::Limit {
                what: format!("a connection registers at most {MAX_FUNCTIONS} functions"),
            });
        }
        self.room_for(bytes, before.unwrap_or(0))?;
        self.ctx.policy.may_register(&registration.id)?;
        Ok(bytes)
    }

    /// Whether `bytes` more registration bytes fit (replacing `before`).
    fn room_for(&self, bytes: usize, before: usize) -> Result<(), Refusal> {
        if bytes > MAX_REGISTRATION_BYTES {
            return Err(Refusal::Limit {
                what: format!(
                    "a registration's schemas, description and metadata hold at most {MAX_REGISTRATION_BYTES} bytes"
                ),
            });
        }
        if self.registration_bytes - before + bytes > MAX_CONNECTION_REGISTRATION_BYTES {
            return Err(Refusal::Limit {
                what: format!(
                    "a connection's registrations hold at most {MAX_CONNECTION_REGISTRATION_BYTES} bytes"
                ),
            });
        }
        Ok(())
    }

    /// An HTTP-invoked function: the engine would send requests from the host. Never from a
    /// sandbox; from a worker VM when the operator allows it, never with `auth` (which names
    /// an environment variable of the engine's whose value it sends).
    fn check_http(&self, invocation: &HttpInvocation) -> Result<(), Refusal> {
        if !self.ctx.policy.http_functions() {
            return Err(Refusal::rule_of(
                "http function",
                format!(
                    "a {} may not register an HTTP-invoked function (`invocation`): the engine would send requests from the host on its behalf",
                    self.ctx.policy.whom()
                ),
            ));
        }
        if invocation.auth.is_some() {
            return Err(Refusal::rule_of(
                "http auth",
                "an HTTP-invoked function may not carry `auth`: it names the engine's environment variables",
            ));
        }
        let url = invocation.url.as_str();
        let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
        if !scheme_ok
            || url.len() > 2048
            || url
                .chars()
                .any(|c| c.is_whitespace() || crate::name::invisible(c))
        {
            return Err(Refusal::rule_of(
                "http url",
                "`invocation.url` must be an http(s) URL",
            ));
        }
        for (key, value) in invocation.headers.iter().flatten() {
            if name(key, Kind::Id, "header").is_err()
                || value.len() > 8192
                || value.chars().any(char::is_control)
            {
                return Err(Refusal::rule_of(
                    "http header",
                    "a header of `invocation` is not a plain header",
                ));
            }
        }
        Ok(())
    }

    fn call(&mut self, mut call: InvokeFunction, out: &mut Vec<Out>) -> Result<(), Malformed> {
        let kind = message::INVOKE_FUNCTION;
        trace_fields(kind, &call.traceparent, &call.baggage)?;
        // Asserted by the SDK, unverifiable: never relayed.
        call.caller = None;
        call.observe_depth = None;
        if let Some(id) = call.invocation_id {
            if self.calling.contains(&id) {
                return Err(Malformed::new(
                    kind,
                    "an invocation id already awaiting its result",
                ));
            }
        }
        let raw_function = call.function_id.clone();
        match self.check_call(&mut call) {
            Ok(Some(call)) => {
                if let Some(id) = call.invocation_id {
                    self.calling.insert(id);
                }
                self.to_engine(out, ToEngine::InvokeFunction(call));
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(Verdict::Refused(refusal)) => {
                self.ctx.log(kind, &refusal.rule(), Some(&raw_function));
                if let Some(id) = call.invocation_id {
                    out.push(Out::Guest(Message::text(wire::call_refused(
                        &id.to_string(),
                        &raw_function,
                        &refusal,
                    ))));
                }
                Ok(())
            }
            Err(Verdict::Fatal(refusal, name, namespace)) => {
                self.ctx.log(kind, &refusal.rule(), Some(&name));
                out.push(Out::Guest(Message::text(wire::worker_rejected(
                    &name,
                    namespace.as_deref(),
                    &refusal,
                ))));
                // Fatal, as the engine's own conflict is: the connection ends.
                out.push(Out::Close);
                Ok(())
            }
        }
    }

    /// The call to send, re-written; `Ok(None)` when nothing is sent.
    fn check_call(&mut self, call: &mut InvokeFunction) -> Result<Option<InvokeFunction>, Verdict> {
        call.function_id = name(&call.function_id, Kind::Id, "function id")?;
        let policy = Arc::clone(&self.ctx.policy);
        policy.may_use_namespace(call.namespace.as_deref())?;
        match &call.action {
            Some(message::Action::Enqueue { queue }) => {
                if !policy.is_worker_vm() {
                    return Err(Refusal::rule_of(
                        "enqueue",
                        "a sandbox's calls are not routed through the engine's queues",
                    )
                    .into());
                }
                name(queue, Kind::Id, "queue")?;
            }
            Some(message::Action::Void) | None => {}
        }
        if json_len(&call.metadata) > MAX_CALL_METADATA {
            return Err(Refusal::Limit {
                what: format!("a call's metadata holds at most {MAX_CALL_METADATA} bytes"),
            }
            .into());
        }
        if call.invocation_id.is_some() && self.calling.len() >= MAX_CALLS_IN_FLIGHT {
            return Err(Refusal::Limit {
                what: format!("the sandbox has {MAX_CALLS_IN_FLIGHT} calls awaiting an answer"),
            }
            .into());
        }
        if call.function_id == WORKER_ANNOUNCEMENT {
            return self.announcement(call).map(Some);
        }
        if call.function_id == CHANNEL_CREATE {
            let request = channel_request(&call.data)?;
            let taken = match self.ctx.shared.channels.lock() {
                Ok(mut budget) => budget.take(Instant::now()),
                Err(_) => Err(ChannelCeiling::Rate),
            };
            match taken {
                Ok(()) => {}
                Err(ChannelCeiling::Rate) => {
                    return Err(Refusal::Limit {
                        what: format!("a sandbox creates at most {CHANNEL_RATE} channels a second"),
                    }
                    .into())
                }
                Err(ChannelCeiling::Live) => {
                    return Err(Refusal::Limit {
                        what: format!(
                            "a sandbox creates at most {MAX_LIVE_CHANNELS} channels in {} s",
                            crate::limits::CHANNEL_WINDOW.as_secs()
                        ),
                    }
                    .into())
                }
            }
            call.data = serde_json::to_value(request).expect("a channel request serialises");
            call.metadata = None;
            return Ok(Some(call.clone()));
        }
        policy.may_call(&call.function_id)?;
        if policy.is_worker_vm()
            && call.function_id.starts_with("configuration::")
            && holds_placeholder(&call.data)
        {
            return Err(Refusal::rule_of(
                "configuration placeholder",
                "`${` in a configuration value would be expanded from the engine's environment",
            )
            .into());
        }
        Ok(Some(call.clone()))
    }

    /// `engine::workers::register`, rebuilt by the guard from the fields it validated.
    fn announcement(&mut self, call: &mut InvokeFunction) -> Result<InvokeFunction, Verdict> {
        let policy = Arc::clone(&self.ctx.policy);
        let fatal = |refusal: Refusal, name: &str, namespace: Option<&str>| {
            Verdict::Fatal(refusal, name.to_string(), namespace.map(String::from))
        };
        let Value::Object(_) = &call.data else {
            return Err(fatal(
                Refusal::rule_of(
                    "announcement",
                    "the worker announcement's data must be an object",
                ),
                "",
                None,
            ));
        };
        let mut announced: Announcement =
            serde_json::from_value(call.data.clone()).map_err(|_| {
                fatal(
                Refusal::rule_of(
                    "announcement",
                    "the worker announcement holds only the fields the SDKs send (no `_` fields)",
                ),
                "",
                None,
            )
            })?;
        let raw_name = announced.name.clone();
        let namespace = announced.namespace.clone();
        announced.name = clean(&announced.name, Kind::Label).map_err(|bad| {
            fatal(
                bad_name("worker name", bad),
                &raw_name,
                namespace.as_deref(),
            )
        })?;
        policy
            .may_name_worker(&announced.name)
            .map_err(|r| fatal(r, &raw_name, namespace.as_deref()))?;
        policy
            .may_use_namespace(namespace.as_deref())
            .map_err(|r| fatal(r, &raw_name, namespace.as_deref()))?;
        let labels = [
            &mut announced.runtime,
            &mut announced.version,
            &mut announced.os,
            &mut announced.isolation,
        ];
        for field in labels {
            if let Some(text) = field {
                *field =
                    Some(clean(text, Kind::Label).map_err(|bad| {
                        fatal(bad_name("announcement field", bad), &raw_name, None)
                    })?);
            }
        }
        if let Some(text) = &announced.description {
            announced.description = Some(
                clean(text, Kind::Text)
                    .map_err(|bad| fatal(bad_name("description", bad), &raw_name, None))?,
            );
        }
        if let Some(telemetry) = &mut announced.telemetry {
            telemetry.amplitude_api_key = None;
            for field in [
                &mut telemetry.language,
                &mut telemetry.project_name,
                &mut telemetry.framework,
            ] {
                if let Some(text) = field {
                    *field =
                        Some(clean(text, Kind::Label).map_err(|bad| {
                            fatal(bad_name("telemetry field", bad), &raw_name, None)
                        })?);
                }
            }
        }
        if let Some(features) = &mut announced.features {
            features.retain(|f| RELAYED_FEATURES.contains(&f.as_str()));
        }
        Ok(InvokeFunction {
            invocation_id: call.invocation_id,
            function_id: WORKER_ANNOUNCEMENT.into(),
            data: serde_json::to_value(&announced).expect("an announcement serialises"),
            traceparent: call.traceparent.clone(),
            baggage: call.baggage.clone(),
            action: call.action.clone(),
            metadata: None,
            namespace: None,
            caller: None,
            observe_depth: None,
        })
    }

    fn register_trigger_type(
        &mut self,
        mut t: RegisterTriggerType,
        out: &mut Vec<Out>,
    ) -> Result<(), Malformed> {
        let kind = message::REGISTER_TRIGGER_TYPE;
        let raw_id = t.id.clone();
        let verdict = (|| -> Result<usize, Refusal> {
            t.id = name(&t.id, Kind::Id, "trigger type")?;
            t.description = name_or_empty(&t.description)?;
            self.ctx.policy.may_use_namespace(t.namespace.as_deref())?;
            let bytes = t.description.len()
                + json_len(&t.trigger_request_format)
                + json_len(&t.call_request_format);
            let before = self.trigger_types.get(&t.id).copied();
            if before.is_none() && self.trigger_types.len() >= MAX_TRIGGER_TYPES {
                return Err(Refusal::Limit {
                    what: format!(
                        "a connection provides at most {MAX_TRIGGER_TYPES} trigger types"
                    ),
                });
            }
            self.room_for(bytes, before.unwrap_or(0))?;
            Ok(bytes)
        })();
        match verdict {
            Ok(bytes) => {
                if let Some(before) = self.trigger_types.insert(t.id.clone(), bytes) {
                    self.registration_bytes -= before;
                }
                self.registration_bytes += bytes;
                self.to_engine(out, ToEngine::RegisterTriggerType(t));
            }
            // The protocol has no refusal of a trigger type: it is not provided, and logged.
            Err(refusal) => self.ctx.log(kind, &refusal.rule(), Some(&raw_id)),
        }
        Ok(())
    }

    fn register_trigger(
        &mut self,
        mut t: RegisterTrigger,
        out: &mut Vec<Out>,
    ) -> Result<(), Malformed> {
        let kind = message::REGISTER_TRIGGER;
        let raw = (t.id.clone(), t.trigger_type.clone(), t.function_id.clone());
        let verdict = (|| -> Result<usize, Refusal> {
            t.id = name(&t.id, Kind::Id, "trigger id")?;
            t.trigger_type = name(&t.trigger_type, Kind::Id, "trigger type")?;
            t.function_id = name(&t.function_id, Kind::Id, "function id")?;
            let policy = &self.ctx.policy;
            policy.may_use_namespace(t.namespace.as_deref())?;
            policy.may_use_namespace(t.trigger_namespace.as_deref())?;
            // A trigger makes the engine call its function: never one reserved.
            policy.may_register(&t.function_id)?;
            let bytes = json_len(&Some(t.config.clone())) + json_len(&t.metadata);
            let before = self.triggers.get(&t.id).map(|(bytes, _)| *bytes);
            if before.is_none() && self.triggers.len() >= MAX_TRIGGERS {
                return Err(Refusal::Limit {
                    what: format!("a connection binds at most {MAX_TRIGGERS} triggers"),
                });
            }
            self.room_for(bytes, before.unwrap_or(0))?;
            Ok(bytes)
        })();
        match verdict {
            Ok(bytes) => {
                t.message_type = None;
                let entry = (bytes, t.trigger_type.clone());
                if let Some((before, _)) = self.triggers.insert(t.id.clone(), entry) {
                    self.registration_bytes -= before;
                }
                self.registration_bytes += bytes;
                self.to_engine(out, ToEngine::RegisterTrigger(t));
            }
            Err(refusal) => {
                self.ctx.log(kind, &refusal.rule(), Some(&raw.2));
                let answer = FromEngine::TriggerRegistrationResult(message::EngineTriggerResult {
                    id: raw.0,
                    trigger_type: raw.1,
                    function_id: raw.2,
                    error: Some(serde_json::json!({
                        "code": wire::REFUSED_CODE,
                        "message": refusal.to_string(),
                    })),
                });
                self.to_guest(out, &answer);
            }
        }
        Ok(())
    }

    fn to_engine(&self, out: &mut Vec<Out>, message: ToEngine) {
        out.push(Out::Engine(Message::text(message.text())));
    }

    fn to_guest(&self, out: &mut Vec<Out>, message: &FromEngine) {
        out.push(Out::Guest(Message::text(message.text())));
    }

    /// The functions this connection served vanish with it.
    pub fn end(&mut self) {
        self.ctx
            .functions
            .fetch_sub(self.served.len(), Ordering::Relaxed);
        self.served.clear();
        self.registration_bytes = 0;
    }
}

/// How a call is refused: answered (`Refused`), or fatally for the connection, as a worker
/// conflict (`Fatal`: the refusal, the name announced, its namespace).
enum Verdict {
    Refused(Refusal),
    Fatal(Refusal, String, Option<String>),
}

impl From<Refusal> for Verdict {
    fn from(refusal: Refusal) -> Verdict {
        Verdict::Refused(refusal)
    }
}

/// The refusal of a bad name, naming what it was and the rule.
fn bad_name(what: &str, bad: BadText) -> Refusal {
    Refusal::rule_of(
        bad.rule(),
        format!(
            "a {what} is NFC text of at most {MAX_ID_LEN} visible characters (no control, format or invisible characters)"
        ),
    )
}

/// `text` cleaned as `kind`, or its refusal. An id must already be in NFC: the guest's SDK
/// knows its functions and triggers by the id it sent, so the guard cannot change it.
fn name(text: &str, kind: Kind, what: &str) -> Result<String, Refusal> {
    let cleaned = clean(text, kind).map_err(|bad| bad_name(what, bad))?;
    if kind == Kind::Id && cleaned != text {
        return Err(Refusal::rule_of(
            "not NFC",
            format!("a {what} is text in Unicode normal form C"),
        ));
    }
    Ok(cleaned)
}

/// A description that may be empty (a trigger type's).
fn name_or_empty(text: &str) -> Result<String, Refusal> {
    if text.is_empty() {
        Ok(String::new())
    } else {
        name(text, Kind::Text, "description")
    }
}

/// An id the guest echoes back (a worker id, a reattach token): short visible text.
fn id_text(kind: &'static str, text: &str) -> Result<(), Malformed> {
    match clean(text, Kind::Id) {
        Ok(clean) if clean == text && text.len() <= 128 => Ok(()),
        _ => Err(Malformed::new(kind, "an id that is not short visible text")),
    }
}

/// W3C trace context: `traceparent` as the standard spells it, `baggage` printable and
/// bounded.
fn trace_fields(
    kind: &'static str,
    traceparent: &Option<String>,
    baggage: &Option<String>,
) -> Result<(), Malformed> {
    if let Some(tp) = traceparent {
        let parts: Vec<&str> = tp.split('-').collect();
        let shape = [2, 32, 16, 2];
        let ok = parts.len() == 4
            && parts.iter().zip(shape).all(|(p, n)| {
                p.len() == n
                    && p.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            });
        if !ok {
            return Err(Malformed::new(
                kind,
                "a traceparent that is not W3C trace context",
            ));
        }
    }
    if let Some(baggage) = baggage {
        if baggage.len() > MAX_BAGGAGE || !baggage.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(Malformed::new(
                kind,
                "baggage that is not printable ASCII of at most 8 KiB",
            ));
        }
    }
    Ok(())
}

/// An error a guest answers with: a short code.
fn error_body(kind: &'static str, error: &message::ErrorBody) -> Result<(), Malformed> {
    if error.code.chars().count() > MAX_ID_LEN || error.code.chars().any(char::is_control) {
        return Err(Malformed::new(
            kind,
            "an error code that is not a short line",
        ));
    }
    Ok(())
}

/// The data of `engine::channels::create`: an object with `buffer_size` at most.
fn channel_request(data: &Value) -> Result<ChannelRequest, Refusal> {
    let refusal = || {
        Refusal::rule_of(
            "channel request",
            format!("`engine::channels::create` takes an object with an optional `buffer_size` of at most {MAX_CHANNEL_BUFFER}"),
        )
    };
    let Value::Object(_) = data else {
        return Err(refusal());
    };
    let request: ChannelRequest = serde_json::from_value(data.clone()).map_err(|_| refusal())?;
    if request.buffer_size.is_some_and(|n| n > MAX_CHANNEL_BUFFER) {
        return Err(refusal());
    }
    Ok(request)
}

/// Whether any string in `value` (keys included) holds a `${` placeholder.
fn holds_placeholder(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains("${"),
        Value::Array(items) => items.iter().any(holds_placeholder),
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k.contains("${") || holds_placeholder(v)),
        _ => false,
    }
}

/// Bytes of a JSON value as the guard serialises it.
fn json_len(value: &Option<Value>) -> usize {
    value
        .as_ref()
        .map_or(0, |v| serde_json::to_string(v).map_or(0, |s| s.len()))
}

/// The bytes of a text or binary frame (the protocol takes JSON in either).
fn payload(message: &Message) -> Option<&[u8]> {
    match message {
        Message::Text(text) => Some(text.as_bytes()),
        Message::Binary(bytes) => Some(bytes),
        _ => None,
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
