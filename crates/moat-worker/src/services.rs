//! The `kv` and `queue` bindings: reads from the snapshot of the granted
//! namespaces (with this invocation's own writes), and writes and sends
//! kept as effects, which the host makes only if the invocation succeeds.

use crate::bindings::moat::worker::types::BindingError;
use crate::bindings::{BindingState, code, failed, moat};
use crate::host::Host;

impl BindingState {
    /// The namespace's current entries, when `namespace` is granted.
    fn namespace(
        &mut self,
        namespace: &str,
    ) -> Result<&mut std::collections::BTreeMap<String, moat_worker_api::Value>, BindingError> {
        let kv = self.kv.as_mut().ok_or(BindingError::NotGranted)?;
        if !moat_worker_api::valid_name(namespace) {
            return Err(BindingError::InvalidName);
        }
        kv.namespaces
            .get_mut(namespace)
            .ok_or(BindingError::NotGranted)
    }

    /// Sets or deletes a key, remembered as an effect.
    fn kv_write(
        &mut self,
        namespace: &str,
        key: &str,
        value: Option<Vec<u8>>,
    ) -> Result<(), BindingError> {
        let entries = self.namespace(namespace)?;
        if !moat_worker_api::valid_key(key) {
            return Err(BindingError::InvalidName);
        }
        if value
            .as_ref()
            .is_some_and(|v| v.len() > moat_worker_api::MAX_VALUE_BYTES)
        {
            return Err(BindingError::TooLarge);
        }
        match &value {
            Some(v) => {
                entries.insert(key.to_owned(), moat_worker_api::Value(v.clone()));
            }
            None => {
                entries.remove(key);
            }
        }
        let writes = &mut self.effects.kv;
        // The last write of a key is the one that counts.
        writes.retain(|w| !(w.namespace == namespace && w.key == key));
        if writes.len() >= moat_worker_api::MAX_KV_WRITES {
            return Err(BindingError::TooLarge);
        }
        writes.push(moat_worker_api::KvWrite {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            value: value.map(moat_worker_api::Value),
        });
        Ok(())
    }
}

fn outcome_of<T>(result: &Result<T, BindingError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => code(e),
    }
}

impl moat::worker::kv::Host for Host {
    fn get(&mut self, namespace: String, key: String) -> Result<Option<Vec<u8>>, BindingError> {
        let result = self.bindings.namespace(&namespace).and_then(|entries| {
            if moat_worker_api::valid_key(&key) {
                Ok(entries.get(&key).map(|v| v.0.clone()))
            } else {
                Err(BindingError::InvalidName)
            }
        });
        let bytes = match &result {
            Ok(Some(v)) => v.len() as u64,
            _ => 0,
        };
        let outcome = match &result {
            Ok(None) => "not-found",
            other => outcome_of(other),
        };
        let name = format!("{namespace}/{key}");
        self.bindings
            .record("kv", "get", Some(&name), bytes, outcome);
        result
    }

    fn set(&mut self, namespace: String, key: String, value: Vec<u8>) -> Result<(), BindingError> {
        let bytes = value.len() as u64;
        let result = self.bindings.kv_write(&namespace, &key, Some(value));
        let name = format!("{namespace}/{key}");
        self.bindings
            .record("kv", "set", Some(&name), bytes, outcome_of(&result));
        result
    }

    fn delete(&mut self, namespace: String, key: String) -> Result<(), BindingError> {
        let result = self.bindings.kv_write(&namespace, &key, None);
        let name = format!("{namespace}/{key}");
        self.bindings
            .record("kv", "delete", Some(&name), 0, outcome_of(&result));
        result
    }

    fn keys(&mut self, namespace: String) -> Result<Vec<String>, BindingError> {
        let result = self
            .bindings
            .namespace(&namespace)
            .map(|entries| entries.keys().cloned().collect::<Vec<_>>());
        let bytes = result.as_ref().map_or(0, |k| k.len() as u64);
        self.bindings
            .record("kv", "keys", Some(&namespace), bytes, outcome_of(&result));
        result
    }
}

impl moat::worker::queue::Host for Host {
    fn message(&mut self) -> Option<String> {
        let message = self.bindings.grants.message.clone();
        let bytes = message.as_ref().map_or(0, |m| m.len() as u64);
        let outcome = if message.is_some() { "ok" } else { "not-found" };
        self.bindings
            .record("queue", "message", None, bytes, outcome);
        message
    }

    fn send(
        &mut self,
        name: String,
        body: String,
        idempotency_key: Option<String>,
    ) -> Result<(), BindingError> {
        let bytes = body.len() as u64;
        let state = &mut self.bindings;
        let result = if !moat_worker_api::valid_name(&name)
            || idempotency_key
                .as_deref()
                .is_some_and(|k| !moat_worker_api::valid_idempotency_key(k))
        {
            Err(BindingError::InvalidName)
        } else if !state.grants.queues.contains(&name) {
            Err(BindingError::NotGranted)
        } else if body.len() > moat_worker_api::MAX_MESSAGE_BYTES
            || state.effects.sends.len() >= moat_worker_api::MAX_SENDS
        {
            Err(BindingError::TooLarge)
        } else {
            match serde_json::from_str::<serde_json::Value>(&body) {
                Ok(value) => {
                    state.effects.sends.push(moat_worker_api::QueueSend {
                        queue: name.clone(),
                        body: value,
                        idempotency_key,
                    });
                    Ok(())
                }
                Err(e) => Err(failed(format!("the body is not JSON: {e}"))),
            }
        };
        state.record("queue", "send", Some(&name), bytes, outcome_of(&result));
        result
    }
}
