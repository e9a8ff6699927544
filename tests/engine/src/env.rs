//! The engine's environment: what `${VAR}` in configuration and an HTTP function's `auth`
//! read. The process environment, under values a test set on the builder, so a test can give
//! the engine a secret without changing the environment of its own (threaded) process.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default)]
pub struct EngineEnv {
    overrides: BTreeMap<String, String>,
}

impl EngineEnv {
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.overrides.insert(name.into(), value.into());
    }

    /// `name`'s value: the builder's, else the process's.
    pub fn var(&self, name: &str) -> Option<String> {
        self.overrides
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_values_win_and_the_process_fills_in() {
        let mut env = EngineEnv::default();
        assert_eq!(env.var("PATH"), std::env::var("PATH").ok());
        env.set("PATH", "over");
        assert_eq!(env.var("PATH").as_deref(), Some("over"));
        let unset = format!("III_TEST_ENGINE_UNSET_{}", uuid::Uuid::new_v4().simple());
        assert_eq!(env.var(&unset), None);
    }
}
