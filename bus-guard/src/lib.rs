//! The bus guard: a sandbox's WebSocket to the engine ends here, never at the engine. The
//! guard speaks the worker protocol (`docs/contract/PROTOCOL.md`) on both sides and passes on only
//! what the operator's [`Policy`] allows: the guest's registrations, the calls made to its
//! functions and their results, its allowed calls and their results, `reattach`, and its
//! channels' bytes. A refusal is answered at once in the words the SDKs understand
//! (`registrationrejected`, or an `invocationresult` error naming the rule).
//!
//! It knows no backend and nothing of a sandbox but its id: the adapter asks for a
//! [`SandboxBus`] per sandbox (a listener on the host's loopback), each backend forwards the
//! guest's loopback port to it, and dropping it ends every connection of that sandbox.
//!
//! Logs name the sandbox, the function id and the rule; never a payload (whatever
//! `III_DISABLE_TRACE_PAYLOADS` says, the guard records none).

mod guard;
mod json;
mod limits;
mod message;
mod name;
mod pattern;
mod policy;
mod relay;
mod session;
mod wire;

pub use guard::{BusGuard, SandboxBus, MAX_CONNECTIONS, MAX_ENGINE_MESSAGE, MAX_GUEST_MESSAGE};
pub use limits::{
    CHANNEL_RATE, CHANNEL_WINDOW, LOGGED_REFUSALS, MAX_LIVE_CHANNELS, REFUSAL_SUMMARY_INTERVAL,
};
pub use name::{MAX_NAME_CHARS, MAX_TEXT_CHARS};
pub use pattern::{Pattern, PatternError, MAX_PATTERN_LEN};
pub use policy::{
    Policy, PolicyError, Refusal, CALL_KEY, DEFAULT_NAMESPACE, REGISTER_KEY, RESERVED_PREFIXES,
    SDK_ENGINE_CALLS,
};
pub use relay::RATE;
pub use session::{
    MAX_CALLS_IN_FLIGHT, MAX_CALL_METADATA, MAX_CHANNEL_BUFFER, MAX_CONNECTION_REGISTRATION_BYTES,
    MAX_FUNCTIONS, MAX_ID_LEN, MAX_REGISTRATION_BYTES, MAX_SERVING, MAX_TRIGGERS,
    MAX_TRIGGER_TYPES,
};
pub use wire::REFUSED_CODE;
