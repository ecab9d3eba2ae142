//! The `kv` and `queue` bindings' two ends: the snapshot of key-value
//! namespaces an invocation reads, and the effects it asks for — writes
//! and sends that the host makes only if the invocation succeeds, so a
//! failed attempt (retried later) leaves nothing behind.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Most bytes one value holds.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
/// Most bytes one message body holds (its JSON text).
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;
/// Most writes one invocation makes.
pub const MAX_KV_WRITES: usize = 1_000;
/// Most messages one invocation sends.
pub const MAX_SENDS: usize = 100;
/// Most bytes a key takes.
pub const MAX_KEY_BYTES: usize = 512;

/// The granted namespaces as they were when the invocation started:
/// namespace → key → value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvSnapshot {
    pub namespaces: BTreeMap<String, BTreeMap<String, Value>>,
}

/// Bytes carried as base64 in JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value(pub Vec<u8>);

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&B64.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        let text = String::deserialize(d)?;
        B64.decode(text.as_bytes())
            .map(Value)
            .map_err(serde::de::Error::custom)
    }
}

/// One key set (`value`) or deleted (`None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvWrite {
    pub namespace: String,
    pub key: String,
    #[serde(default)]
    pub value: Option<Value>,
}

/// One message to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueSend {
    pub queue: String,
    /// The message: a JSON value.
    pub body: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// What an invocation asked the host to do once it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Effects {
    #[serde(default)]
    pub kv: Vec<KvWrite>,
    #[serde(default)]
    pub sends: Vec<QueueSend>,
}

/// Whether `name` is a namespace's or a queue's name: 1 to 64 of
/// `a-z 0-9 _ . -`, starting with a letter or digit (it names a URL path
/// segment).
pub fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && bytes[0].is_ascii_alphanumeric()
        && bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        })
        && !bytes.iter().any(u8::is_ascii_uppercase)
}

/// Whether `key` is a key: 1 to 512 bytes of UTF-8 with no control
/// character.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_BYTES && !key.chars().any(char::is_control)
}

/// Whether `key` is an idempotency key: 1 to 200 printable ASCII bytes.
pub fn valid_idempotency_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 200 && key.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys() {
        for good in ["config", "a", "q-1.x_y", "0abc"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "Config", "-a", ".a", "a/b", "a b", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_key("greeting/en"));
        assert!(!valid_key(""));
        assert!(!valid_key("a\nb"));
        assert!(!valid_key(&"k".repeat(513)));
    }

    #[test]
    fn values_are_base64_in_json() -> Result<(), serde_json::Error> {
        let write = KvWrite {
            namespace: "n".into(),
            key: "k".into(),
            value: Some(Value(vec![0, 255])),
        };
        let text = serde_json::to_string(&write)?;
        assert!(text.contains("\"AP8=\""), "{text}");
        assert_eq!(serde_json::from_str::<KvWrite>(&text)?, write);
        assert!(
            serde_json::from_str::<KvWrite>(r#"{"namespace":"n","key":"k","value":"!"}"#).is_err()
        );
        Ok(())
    }
}
