//! Functions the engine serves itself: `engine::*` and `configuration::*`.

mod configuration;
mod engine_fns;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::state::State;
use crate::wire::ErrorBody;

/// Every built-in: id and description (listed by `engine::functions::list` with
/// `include_internal`).
pub const BUILTINS: &[(&str, &str)] = &[
    ("engine::workers::register", "Register worker metadata"),
    (
        "engine::workers::list",
        "List workers connected to the engine",
    ),
    ("engine::functions::list", "List registered functions"),
    (
        "engine::functions::info",
        "Inspect one function: schemas and owner",
    ),
    (
        "engine::channels::create",
        "Create a streaming channel pair",
    ),
    ("configuration::register", "Declare a configuration entry"),
    ("configuration::get", "Read a configuration entry"),
    (
        "configuration::set",
        "Replace a configuration entry's value",
    ),
];

pub fn is_builtin(function_id: &str) -> bool {
    BUILTINS.iter().any(|(id, _)| *id == function_id)
}

/// Runs the built-in `function_id`; `None` when no built-in has that id. Object `data`
/// carries the engine-stamped `_caller_worker_id`.
pub fn call(state: &mut State, function_id: &str, data: Value) -> Option<Result<Value, ErrorBody>> {
    let outcome = match function_id {
        "engine::workers::register" => crate::registration::register_worker(state, data),
        "engine::workers::list" => Ok(engine_fns::workers_list(state)),
        "engine::functions::list" => engine_fns::functions_list(state, data),
        "engine::functions::info" => engine_fns::functions_info(state, data),
        "engine::channels::create" => engine_fns::channels_create(state, data),
        "configuration::register" => configuration::register(state, data),
        "configuration::get" => configuration::get(state, data),
        "configuration::set" => configuration::set(state, data),
        _ => return None,
    };
    Some(outcome)
}

/// Decodes a built-in's input; `null` reads as `{}`.
fn input<T: DeserializeOwned>(function_id: &str, data: Value) -> Result<T, ErrorBody> {
    let data = if data.is_null() { json!({}) } else { data };
    serde_json::from_value(data)
        .map_err(|e| ErrorBody::new("INVALID_ARGUMENTS", format!("{function_id}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_builtin_is_served_and_nothing_else() {
        let mut state = State::default();
        for (id, _) in BUILTINS {
            assert!(
                call(&mut state, id, Value::Null).is_some(),
                "{id} not served"
            );
        }
        assert!(call(&mut state, "engine::nope", Value::Null).is_none());
        assert!(!is_builtin("engine::nope"));
    }
}
