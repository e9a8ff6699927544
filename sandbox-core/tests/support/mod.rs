//! Shared by the randomised request tests: a backend that never boots, a deterministic
//! generator, and random JSON built around a vocabulary of real field names and strings.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use plugin_api::Plugin;
use sandbox_core::{Backend, BootSpec, Booted, HostUnfit, SandboxError};
use serde_json::{json, Map, Value};

pub struct NoBoot;

#[async_trait]
impl Backend for NoBoot {
    fn name(&self) -> &'static str {
        "none"
    }
    fn probe(&self) -> Result<(), HostUnfit> {
        Ok(())
    }
    async fn boot(&self, _spec: &BootSpec) -> Result<Booted, SandboxError> {
        Err(SandboxError::BootFailed("test backend never boots".into()))
    }
}

/// xorshift64*: deterministic, so a failure reproduces.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// What random values are made of.
pub struct Vocabulary {
    /// Object keys: the functions' real field names.
    pub fields: &'static [&'static str],
    /// Strings worth trying in those fields.
    pub strings: &'static [&'static str],
    /// Whether floats are among the scalars.
    pub floats: bool,
    /// Upper bound (exclusive) of a long string's length, of an array's items and of an
    /// object's fields.
    pub longest: u64,
    pub items: u64,
    pub members: u64,
}

impl Vocabulary {
    /// A random JSON value, nested at most `depth` deep.
    pub fn value(&self, rng: &mut Rng, depth: u32) -> Value {
        let scalars = if self.floats { 6 } else { 5 };
        let kind = rng.below(if depth == 0 { scalars } else { scalars + 2 });
        // Without floats, kinds from 3 on shift down by one.
        let kind = if !self.floats && kind >= 3 {
            kind + 1
        } else {
            kind
        };
        match kind {
            0 => Value::Null,
            1 => Value::Bool(rng.below(2) == 0),
            2 => json!(rng.next() as i64 >> rng.below(64)),
            3 => json!((rng.next() as f64) / 7.0 - 1e18),
            4 => Value::String(rng.pick(self.strings).to_string()),
            5 => Value::String("x".repeat(rng.below(self.longest) as usize)),
            6 => Value::Array(
                (0..rng.below(self.items))
                    .map(|_| self.value(rng, depth - 1))
                    .collect(),
            ),
            _ => {
                let mut object = Map::new();
                for _ in 0..rng.below(self.members) {
                    object.insert(
                        rng.pick(self.fields).to_string(),
                        self.value(rng, depth - 1),
                    );
                }
                Value::Object(object)
            }
        }
    }

    /// `payload` with one random field left as it is, removed, or set to a random value:
    /// of `choices` equally likely outcomes, the first leaves it, the second removes it, the
    /// others replace it.
    pub fn mutate(&self, rng: &mut Rng, mut payload: Value, choices: u64) -> Value {
        if let Some(object) = payload.as_object_mut() {
            let field = rng.pick(self.fields).to_string();
            match rng.below(choices) {
                0 => {}
                1 => {
                    object.remove(&field);
                }
                _ => {
                    object.insert(field, self.value(rng, 2));
                }
            }
        }
        payload
    }
}

/// Calls `plugin` `rounds` times with the function and payload `next` makes from a generator
/// seeded the same every run. None may panic; every refusal must carry one of `allowed`, and
/// each of `must_reach` must come up (else the generator is too tame to mean anything).
pub async fn only_earnable_codes<P: Plugin>(
    plugin: &Arc<P>,
    rounds: usize,
    allowed: &[&str],
    must_reach: &[&str],
    mut next: impl FnMut(&mut Rng) -> (String, Value),
) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut seen = BTreeSet::new();
    for round in 0..rounds {
        let (function, payload) = next(&mut rng);
        let outcome = Arc::clone(plugin)
            .invoke(function.clone(), payload.clone())
            .await;
        if let Err(body) = outcome {
            assert!(
                allowed.contains(&body.code.as_str()),
                "round {round}: {function} {payload} -> {body:?}"
            );
            seen.insert(body.code);
        }
    }
    println!("codes seen: {seen:?}");
    for code in must_reach {
        assert!(
            seen.contains(*code),
            "the generator must reach {code}: {seen:?}"
        );
    }
}
