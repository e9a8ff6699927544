//! The bus guard: a sandbox's WebSocket to the engine ends here, never at the engine. The
//! guard speaks the worker protocol (`shared/PROTOCOL.md`) on both sides and passes on only
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
mod pattern;
mod policy;
mod relay;
mod session;
mod wire;

pub use guard::{BusGuard, SandboxBus, MAX_CONNECTIONS, MAX_ENGINE_MESSAGE, MAX_GUEST_MESSAGE};
pub use pattern::{Pattern, PatternError, MAX_PATTERN_LEN};
pub use policy::{
    Policy, PolicyError, Refusal, CALL_KEY, REGISTER_KEY, RESERVED_PREFIXES, SDK_ENGINE_CALLS,
};
pub use relay::RATE;
pub use session::{MAX_CALLS_IN_FLIGHT, MAX_FUNCTIONS, MAX_ID_LEN, MAX_SERVING};
pub use wire::REFUSED_CODE;
