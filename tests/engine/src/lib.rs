//! iii-test-engine: a small iii engine for tests and the README quickstart.
//!
//! It speaks the iii worker protocol (see the project's PROTOCOL notes) closely enough that `iii-sdk`
//! cannot tell it from the real engine: `workerregistered` with a reattach token, namespaced
//! function registration with both conflict codes, call routing with `_caller_worker_id`,
//! `function_not_found` and `invocation_stopped`, ping/pong, HTTP-invoked functions (the
//! engine sends the call from its own host, with a credential from its environment), worker
//! names sanitised and `engine::workers::register`'s array data read positionally as the real
//! engine does (so the attacks a sandbox bus guard must stop are real here), the built-ins
//! (`engine::workers::{register,list}`, `engine::functions::{list,info}`,
//! `engine::channels::create`, `configuration::{register,get,set}`), byte channels, and
//! workers' trigger types with their bindings (`registertriggertype`, `registertrigger`,
//! `unregistertrigger`, `triggerregistrationresult`, passed between subscriber and owner).
//!
//! It is not the real engine: no built-in triggers, queues, observers, RBAC, persistence or
//! telemetry, and it does not advertise protocol features (the SDK treats it like an engine without
//! observe, so calls always go through the engine).
//!
//! | Concern | File |
//! |---|---|
//! | messages on the wire | `wire.rs` |
//! | listener, start/stop/restart | `server.rs` |
//! | one worker socket | `connection.rs` |
//! | connect, register, reattach, disconnect | `registration.rs` |
//! | call routing | `invoke.rs` |
//! | trigger types and bindings | `triggers.rs` |
//! | HTTP-invoked functions | `http_function.rs` |
//! | the engine's environment | `env.rs` |
//! | built-in functions | `builtins/` |
//! | configuration store | `config_store.rs` |
//! | byte channels | `channels.rs`, `channel_socket.rs` |
//! | raw-protocol test client | `client.rs` |

#![forbid(unsafe_code)]

mod builtins;
mod channel_socket;
mod channels;
pub mod client;
mod config_store;
mod connection;
mod env;
mod functions;
mod http_function;
mod invoke;
mod pending;
mod registration;
mod server;
mod state;
mod triggers;
mod wire;
mod worker;

pub use http_function::UrlPolicy;
pub use registration::sanitize_worker_text;
pub use server::{Engine, EngineBuilder, EngineError, EngineHandle, EngineStats};
pub use wire::{
    DEFAULT_NAMESPACE, FUNCTION_NAMESPACE_CONFLICT, FUNCTION_NOT_FOUND, INVALID_NAMESPACE,
    INVOCATION_STOPPED, WORKER_NAMESPACE_CONFLICT,
};
