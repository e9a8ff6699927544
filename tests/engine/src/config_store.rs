//! Configuration entries behind `configuration::register/get/set`, with `${VAR:default}`
//! expansion from the engine's environment.

use std::collections::HashMap;

use serde_json::Value;

use crate::wire::ErrorBody;

pub const NOT_FOUND: &str = "NOT_FOUND";
pub const NOT_REGISTERED: &str = "NOT_REGISTERED";
pub const INVALID_ID: &str = "INVALID_ID";

#[derive(Debug, Clone, Default)]
struct Entry {
    value: Option<Value>,
    /// Set by `configuration::register`; `set` is refused before it.
    registration: Option<Value>,
}

#[derive(Debug, Default)]
pub struct ConfigStore {
    entries: HashMap<String, Entry>,
}

impl ConfigStore {
    /// Pre-seeds a value (like an engine config file would); the id stays unregistered.
    pub fn seed(&mut self, id: &str, value: Value) {
        self.entries.entry(id.to_string()).or_default().value = Some(value);
    }

    /// Records a registration; an `initial_value` fills an entry that has no value yet.
    pub fn register(
        &mut self,
        id: &str,
        registration: Value,
        initial_value: Option<Value>,
    ) -> Result<Value, ErrorBody> {
        check_id(id)?;
        let entry = self.entries.entry(id.to_string()).or_default();
        entry.registration = Some(registration);
        if entry.value.is_none() {
            entry.value = initial_value;
        }
        Ok(serde_json::json!({ "id": id, "value": entry.value }))
    }

    /// The value, expanded from `env` unless `raw`.
    pub fn get(
        &self,
        id: &str,
        raw: bool,
        env: impl Fn(&str) -> Option<String> + Copy,
    ) -> Result<Value, ErrorBody> {
        check_id(id)?;
        let value = self
            .entries
            .get(id)
            .and_then(|e| e.value.clone())
            .ok_or_else(|| ErrorBody::new(NOT_FOUND, format!("Configuration '{id}' not found.")))?;
        Ok(if raw { value } else { expand_value(value, env) })
    }

    /// Replaces the value; returns the old one.
    pub fn set(&mut self, id: &str, value: Value) -> Result<Option<Value>, ErrorBody> {
        check_id(id)?;
        match self.entries.get_mut(id) {
            Some(entry) if entry.registration.is_some() => Ok(entry.value.replace(value)),
            _ => Err(ErrorBody::new(
                NOT_REGISTERED,
                format!("Configuration '{id}' is not registered."),
            )),
        }
    }
}

/// Ids match `[a-z0-9_-]{1,64}`.
fn check_id(id: &str) -> Result<(), ErrorBody> {
    let valid = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(ErrorBody::new(
            INVALID_ID,
            format!("Configuration id '{id}' must match [a-z0-9_-]{{1,64}}."),
        ))
    }
}

/// Expands placeholders in every string of a JSON value.
pub fn expand_value(value: Value, env: impl Fn(&str) -> Option<String> + Copy) -> Value {
    match value {
        Value::String(s) => Value::String(expand_str(&s, env)),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| expand_value(v, env)).collect())
        }
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, expand_value(v, env)))
                .collect(),
        ),
        other => other,
    }
}

/// `${NAME}` and `${NAME:default}`: the variable when set, else the default, else empty.
/// Text that is not a well-formed placeholder is kept as written.
pub fn expand_str(input: &str, env: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let body = &after[..end];
        let (name, default) = match body.split_once(':') {
            Some((name, default)) => (name, Some(default)),
            None => (body, None),
        };
        if is_var_name(name) {
            let value = env(name).or_else(|| default.map(str::to_string));
            out.push_str(&value.unwrap_or_default());
        } else {
            out.push_str(&rest[start..start + 2 + end + 1]);
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

fn is_var_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(name: &str) -> Option<String> {
        (name == "SET").then(|| "value".to_string())
    }

    #[test]
    fn expands_set_unset_and_defaulted_variables() {
        assert_eq!(expand_str("a${SET}b", env), "avalueb");
        assert_eq!(expand_str("${UNSET:fallback}", env), "fallback");
        assert_eq!(expand_str("${SET:fallback}", env), "value");
        assert_eq!(expand_str("x${UNSET}y", env), "xy");
        assert_eq!(expand_str("${UNSET:a:b}", env), "a:b");
    }

    #[test]
    fn keeps_text_that_is_not_a_placeholder() {
        assert_eq!(expand_str("${not valid}", env), "${not valid}");
        assert_eq!(expand_str("open ${SET", env), "open ${SET");
        assert_eq!(expand_str("$SET", env), "$SET");
    }

    #[test]
    fn expands_nested_strings_only() {
        let value = json!({"a": ["${SET}", 1], "b": {"c": "${UNSET:2}"}});
        assert_eq!(
            expand_value(value, env),
            json!({"a": ["value", 1], "b": {"c": "2"}})
        );
    }

    #[test]
    fn ids_are_checked() {
        let mut store = ConfigStore::default();
        assert_eq!(store.set("Bad Id", json!(1)).unwrap_err().code, INVALID_ID);
        assert_eq!(
            store.get(&"a".repeat(65), false, env).unwrap_err().code,
            INVALID_ID
        );
        assert_eq!(store.get("", false, env).unwrap_err().code, INVALID_ID);
    }

    #[test]
    fn set_needs_registration_and_get_needs_a_value() {
        let mut store = ConfigStore::default();
        assert_eq!(store.get("x", false, env).unwrap_err().code, NOT_FOUND);
        store.seed("x", json!({"k": "${SET}"}));
        assert_eq!(store.set("x", json!(1)).unwrap_err().code, NOT_REGISTERED);
        store
            .register("x", json!({}), Some(json!("ignored")))
            .unwrap();
        assert_eq!(store.get("x", true, env).unwrap(), json!({"k": "${SET}"}));
        assert_eq!(
            store.set("x", json!(2)).unwrap(),
            Some(json!({"k": "${SET}"}))
        );
        assert_eq!(store.get("x", false, env).unwrap(), json!(2));
    }
}
