//! The judgment of one guest worker connection, message by message, free of sockets: what
//! goes on to the engine, what the guard answers itself, and when the connection must end.
//!
//! Guest to engine: its registrations (`sandbox_bus_register`), its calls
//! (`sandbox_bus_call`, the SDKs' own `engine::` calls, the worker's name checked), the
//! results of the calls the engine made to it, `reattach`; `ping` is answered here. Engine to
//! guest: the greeting (without `features`), calls to the guest's own functions, the results
//! of its calls, refusals. Everything else (triggers, observers, unknown types) is dropped
//! both ways, as the protocol says unknown types are.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio_tungstenite::tungstenite::Message;

use crate::policy::{Policy, Refusal, WORKER_ANNOUNCEMENT};
use crate::wire::{self, Announcement, Head};

/// Functions one connection may register.
pub const MAX_FUNCTIONS: usize = 1024;
/// The guest's calls awaiting their results, per connection.
pub const MAX_CALLS_IN_FLIGHT: usize = 1024;
/// Calls to the guest awaiting its results, per connection.
pub const MAX_SERVING: usize = 4096;
/// The longest function id or worker name judged (ids are names, not documents).
pub const MAX_ID_LEN: usize = 512;
/// Refusals logged one by one per connection; past that they are counted.
const LOGGED_REFUSALS: usize = 32;

/// What a connection belongs to, shared by all of a sandbox's connections.
#[derive(Clone)]
pub(crate) struct Context {
    pub sandbox: Arc<str>,
    pub policy: Arc<Policy>,
    /// Functions the sandbox serves on the bus (all its connections).
    pub functions: Arc<AtomicUsize>,
}

/// What the relay does with a message.
#[derive(Debug)]
pub(crate) enum Out {
    Engine(Message),
    Guest(Message),
    /// End the connection (after what is already queued for the guest).
    Close,
}

/// Why a guest's message ends its connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub &'static str);

pub(crate) struct Session {
    ctx: Context,
    /// Function ids registered through this connection and not refused.
    served: HashSet<String>,
    /// Invocation ids the engine sent the guest, awaiting its result.
    serving: HashSet<String>,
    /// Invocation ids of the guest's calls, awaiting the engine's result.
    calling: HashSet<String>,
    refusals: usize,
}

impl Session {
    pub fn new(ctx: Context) -> Session {
        Session {
            ctx,
            served: HashSet::new(),
            serving: HashSet::new(),
            calling: HashSet::new(),
            refusals: 0,
        }
    }

    /// Judges one data frame from the guest.
    pub fn judge_guest(&mut self, message: &Message, out: &mut Vec<Out>) -> Result<(), Malformed> {
        let frame = payload(message).ok_or(Malformed("not a data frame"))?;
        let head: Head = serde_json::from_slice(frame).map_err(|_| Malformed("not a message"))?;
        match head.kind.as_ref() {
            "registerfunction" => {
                let id = head
                    .id
                    .as_deref()
                    .ok_or(Malformed("registration without id"))?;
                self.register(id, message, out);
            }
            "unregisterfunction" => {
                let id = head
                    .id
                    .as_deref()
                    .ok_or(Malformed("unregistration without id"))?;
                if self.served.remove(id) {
                    self.ctx.functions.fetch_sub(1, Ordering::Relaxed);
                    out.push(Out::Engine(message.clone()));
                }
            }
            "invokefunction" => {
                let function = head
                    .function_id
                    .as_deref()
                    .ok_or(Malformed("call without function_id"))?;
                let call = head
                    .invocation_key()
                    .map_err(|()| Malformed("invocation_id is not a string"))?;
                self.call(function, call, frame, message, out);
            }
            "invocationresult" => {
                let call = head
                    .invocation_key()
                    .map_err(|()| Malformed("invocation_id is not a string"))?;
                // Only the answer to a call the engine made to this guest.
                if call.is_some_and(|id| self.serving.remove(&id)) {
                    out.push(Out::Engine(message.clone()));
                }
            }
            "ping" => out.push(Out::Guest(Message::text(wire::pong()))),
            "reattach" => out.push(Out::Engine(message.clone())),
            _ => {}
        }
        Ok(())
    }

    /// Judges one data frame from the engine (trusted: what cannot be read is dropped).
    pub fn judge_engine(&mut self, message: &Message, out: &mut Vec<Out>) {
        let Some(frame) = payload(message) else {
            return;
        };
        let Ok(head) = serde_json::from_slice::<Head>(frame) else {
            return;
        };
        match head.kind.as_ref() {
            "workerregistered" => {
                if let Some(greeting) = wire::without_features(frame) {
                    out.push(Out::Guest(Message::text(greeting)));
                }
            }
            "invokefunction" => {
                let Some(function) = head.function_id.as_deref() else {
                    return;
                };
                let Ok(call) = head.invocation_key() else {
                    return;
                };
                if !self.served.contains(function) {
                    // Never this guest's function: nothing of another reaches it.
                    if let Some(id) = call {
                        let refusal = Refusal::Limit {
                            what: format!("`{function}` is not served by this sandbox"),
                        };
                        out.push(Out::Engine(Message::text(wire::call_refused(
                            &id, function, &refusal,
                        ))));
                    }
                    return;
                }
                match call {
                    Some(id) if self.serving.len() >= MAX_SERVING => {
                        let refusal = Refusal::Limit {
                            what: format!(
                                "the sandbox has {MAX_SERVING} calls to it awaiting an answer"
                            ),
                        };
                        out.push(Out::Engine(Message::text(wire::call_refused(
                            &id, function, &refusal,
                        ))));
                    }
                    Some(id) => {
                        self.serving.insert(id);
                        out.push(Out::Guest(message.clone()));
                    }
                    None => out.push(Out::Guest(message.clone())),
                }
            }
            "invocationresult" => {
                if let Ok(Some(id)) = head.invocation_key() {
                    self.calling.remove(&id);
                }
                out.push(Out::Guest(message.clone()));
            }
            "registrationrejected" => {
                if let Some(id) = head.function_id.as_deref() {
                    if self.served.remove(id) {
                        self.ctx.functions.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                out.push(Out::Guest(message.clone()));
            }
            "ping" => out.push(Out::Engine(Message::text(wire::pong()))),
            _ => {}
        }
    }

    fn register(&mut self, id: &str, message: &Message, out: &mut Vec<Out>) {
        let verdict = if id.len() > MAX_ID_LEN {
            Err(Refusal::Limit {
                what: format!("a function id is longer than {MAX_ID_LEN} bytes"),
            })
        } else if self.served.len() >= MAX_FUNCTIONS && !self.served.contains(id) {
            Err(Refusal::Limit {
                what: format!("a connection registers at most {MAX_FUNCTIONS} functions"),
            })
        } else {
            self.ctx.policy.may_register(id)
        };
        match verdict {
            Ok(()) => {
                if self.served.insert(id.to_string()) {
                    self.ctx.functions.fetch_add(1, Ordering::Relaxed);
                }
                out.push(Out::Engine(message.clone()));
            }
            Err(refusal) => {
                self.log_refusal("registration", id, &refusal);
                out.push(Out::Guest(Message::text(wire::function_rejected(
                    id, &refusal,
                ))));
            }
        }
    }

    fn call(
        &mut self,
        function: &str,
        call: Option<String>,
        frame: &[u8],
        message: &Message,
        out: &mut Vec<Out>,
    ) {
        let verdict = if function.len() > MAX_ID_LEN {
            Err(Refusal::Limit {
                what: format!("a function id is longer than {MAX_ID_LEN} bytes"),
            })
        } else if function == WORKER_ANNOUNCEMENT {
            let announced: Option<Announcement> = serde_json::from_slice(frame).ok();
            let data = announced.map(|a| a.data).unwrap_or_default();
            if let Some(name) = &data.name {
                if let Err(refusal) = self.ctx.policy.may_name_worker(name) {
                    self.log_refusal("worker name", name, &refusal);
                    out.push(Out::Guest(Message::text(wire::worker_rejected(
                        name,
                        data.namespace.as_deref(),
                        &refusal,
                    ))));
                    // Fatal, as the engine's own conflict is: the connection ends.
                    out.push(Out::Close);
                    return;
                }
            }
            Ok(())
        } else if call.is_some() && self.calling.len() >= MAX_CALLS_IN_FLIGHT {
            Err(Refusal::Limit {
                what: format!("the sandbox has {MAX_CALLS_IN_FLIGHT} calls awaiting an answer"),
            })
        } else {
            self.ctx.policy.may_call(function)
        };
        match (verdict, call) {
            (Ok(()), call) => {
                if let Some(id) = call {
                    self.calling.insert(id);
                }
                out.push(Out::Engine(message.clone()));
            }
            (Err(refusal), call) => {
                self.log_refusal("call", function, &refusal);
                if let Some(id) = call {
                    out.push(Out::Guest(Message::text(wire::call_refused(
                        &id, function, &refusal,
                    ))));
                }
            }
        }
    }

    /// The sandbox id, the function id (escaped: it is the guest's text) and the rule; never
    /// a payload. Past [`LOGGED_REFUSALS`] a connection's refusals are only counted.
    fn log_refusal(&mut self, what: &str, id: &str, refusal: &Refusal) {
        self.refusals += 1;
        if self.refusals <= LOGGED_REFUSALS {
            let id: String = id.chars().take(MAX_ID_LEN).collect();
            tracing::warn!(sandbox_id = %self.ctx.sandbox, function_id = ?id, rule = %refusal.rule(), "bus guard refused a {what}");
        }
    }

    /// The functions this connection served vanish with it.
    pub fn end(&mut self) {
        self.ctx
            .functions
            .fetch_sub(self.served.len(), Ordering::Relaxed);
        self.served.clear();
        if self.refusals > LOGGED_REFUSALS {
            tracing::warn!(
                sandbox_id = %self.ctx.sandbox,
                refusals = self.refusals,
                "bus guard: the connection's refusals past the first {LOGGED_REFUSALS} were not logged one by one"
            );
        }
    }
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
mod tests;
