//! `configuration::register`, `configuration::get`, `configuration::set`.

use serde::Deserialize;
use serde_json::{json, Value};

use super::input;
use crate::state::State;
use crate::wire::ErrorBody;

#[derive(Deserialize)]
struct RegisterInput {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    schema: Option<Value>,
    #[serde(default)]
    initial_value: Option<Value>,
}

#[derive(Deserialize)]
struct GetInput {
    id: String,
    #[serde(default)]
    raw: bool,
}

#[derive(Deserialize)]
struct SetInput {
    id: String,
    value: Value,
}

pub fn register(state: &mut State, data: Value) -> Result<Value, ErrorBody> {
    let input: RegisterInput = input("configuration::register", data)?;
    let registration = json!({
        "name": input.name,
        "description": input.description,
        "schema": input.schema,
    });
    state
        .config
        .register(&input.id, registration, input.initial_value)
}

pub fn get(state: &mut State, data: Value) -> Result<Value, ErrorBody> {
    let input: GetInput = input("configuration::get", data)?;
    let env = &state.env;
    let value = state
        .config
        .get(&input.id, input.raw, |name| env.var(name))?;
    Ok(json!({ "id": input.id, "value": value }))
}

pub fn set(state: &mut State, data: Value) -> Result<Value, ErrorBody> {
    let input: SetInput = input("configuration::set", data)?;
    let old_value = state.config.set(&input.id, input.value.clone())?;
    Ok(json!({ "old_value": old_value, "new_value": input.value }))
}
