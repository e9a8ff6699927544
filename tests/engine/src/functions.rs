//! Registered functions, keyed by (namespace, function id), each owned by one worker.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::http_function::{HttpInvocation, HttpTarget};

/// A function as its worker registered it.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionDef {
    pub id: String,
    pub description: Option<String>,
    pub request_format: Option<Value>,
    pub response_format: Option<Value>,
    pub metadata: Option<Value>,
    /// Set for an HTTP-invoked function: the engine itself calls this URL.
    pub invocation: Option<HttpInvocation>,
}

/// A function in the table: its definition and who serves it.
#[derive(Debug, Clone)]
pub struct FunctionEntry {
    pub def: FunctionDef,
    pub namespace: String,
    pub owner: String,
    /// Where the engine sends the calls of an HTTP-invoked function; `None` routes them to
    /// the owner's connection.
    pub http: Option<Arc<HttpTarget>>,
}

impl FunctionEntry {
    /// The listing shape: the SDK's `FunctionInfo` fields plus the owner.
    pub fn info(&self, owner_name: Option<&str>) -> Value {
        json!({
            "function_id": self.def.id,
            "namespace": self.namespace,
            "description": self.def.description,
            "request_format": self.def.request_format,
            "response_format": self.def.response_format,
            "metadata": self.def.metadata,
            "worker_id": self.owner,
            "worker_name": owner_name,
        })
    }
}

/// Outcome of a registration attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    Added,
    /// The same worker registered the id again: its definition was replaced.
    Replaced,
    /// Another live worker holds the id in this namespace.
    Conflict {
        owner: String,
    },
}

#[derive(Debug, Default)]
pub struct FunctionTable {
    // BTreeMap: listings come out sorted without extra work.
    entries: BTreeMap<(String, String), FunctionEntry>,
}

impl FunctionTable {
    pub fn register(
        &mut self,
        namespace: &str,
        owner: &str,
        def: FunctionDef,
        http: Option<Arc<HttpTarget>>,
    ) -> Registered {
        let key = (namespace.to_string(), def.id.clone());
        if let Some(existing) = self.entries.get_mut(&key) {
            if existing.owner != owner {
                return Registered::Conflict {
                    owner: existing.owner.clone(),
                };
            }
            existing.def = def;
            existing.http = http;
            return Registered::Replaced;
        }
        let entry = FunctionEntry {
            def,
            namespace: namespace.to_string(),
            owner: owner.to_string(),
            http,
        };
        self.entries.insert(key, entry);
        Registered::Added
    }

    /// Removes `id` from every namespace where `owner` serves it.
    pub fn unregister(&mut self, owner: &str, id: &str) {
        self.entries
            .retain(|(_, fid), e| !(fid == id && e.owner == owner));
    }

    pub fn remove_owned_by(&mut self, owner: &str) {
        self.entries.retain(|_, e| e.owner != owner);
    }

    pub fn get(&self, namespace: &str, id: &str) -> Option<&FunctionEntry> {
        self.entries.get(&(namespace.to_string(), id.to_string()))
    }

    /// `id` in `namespace` when given, else in `default`, else in the first namespace holding it.
    pub fn find(&self, namespace: Option<&str>, id: &str) -> Option<&FunctionEntry> {
        match namespace {
            Some(ns) => self.get(ns, id),
            None => self
                .get(crate::wire::DEFAULT_NAMESPACE, id)
                .or_else(|| self.entries.values().find(|e| e.def.id == id)),
        }
    }

    pub fn owned_by(&self, owner: &str) -> Vec<&FunctionEntry> {
        self.entries.values().filter(|e| e.owner == owner).collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn all(&self) -> impl Iterator<Item = &FunctionEntry> {
        self.entries.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(id: &str) -> FunctionDef {
        FunctionDef {
            id: id.into(),
            description: None,
            request_format: None,
            response_format: None,
            metadata: None,
            invocation: None,
        }
    }

    #[test]
    fn second_owner_in_same_namespace_conflicts() {
        let mut table = FunctionTable::default();
        assert_eq!(
            table.register("default", "w1", def("a"), None),
            Registered::Added
        );
        assert_eq!(
            table.register("default", "w2", def("a"), None),
            Registered::Conflict { owner: "w1".into() }
        );
        assert_eq!(
            table.register("other", "w2", def("a"), None),
            Registered::Added
        );
        assert_eq!(
            table.register("default", "w1", def("a"), None),
            Registered::Replaced
        );
    }

    #[test]
    fn removing_an_owner_frees_its_ids() {
        let mut table = FunctionTable::default();
        table.register("default", "w1", def("a"), None);
        table.remove_owned_by("w1");
        assert_eq!(
            table.register("default", "w2", def("a"), None),
            Registered::Added
        );
    }

    #[test]
    fn find_prefers_default_then_any_namespace() {
        let mut table = FunctionTable::default();
        table.register("ns", "w1", def("a"), None);
        assert_eq!(
            table.find(None, "a").map(|e| e.namespace.as_str()),
            Some("ns")
        );
        table.register("default", "w2", def("a"), None);
        assert_eq!(table.find(None, "a").map(|e| e.owner.as_str()), Some("w2"));
        assert!(table.find(Some("x"), "a").is_none());
    }
}
