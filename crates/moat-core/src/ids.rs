//! Plain values checked once, where they enter: a run's and an operation's
//! id, a workspace-relative path, a SHA-256. Each type has one rule and
//! can only hold what passes it (deserialising one checks it), so code
//! that holds one does not check again.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A value that is not what its type allows; says what is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {given:?}: {rule}")]
pub struct InvalidValue {
    pub what: &'static str,
    pub given: String,
    pub rule: &'static str,
}

macro_rules! checked_string {
    ($(#[$meta:meta])* $name:ident, $what:literal, $rule:literal, $pattern:expr, $check:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// What a valid value looks like.
            pub const RULE: &'static str = $rule;

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidValue;
            fn try_from(text: String) -> Result<Self, InvalidValue> {
                let check: fn(&str) -> bool = $check;
                if check(&text) {
                    Ok($name(text))
                } else {
                    Err(InvalidValue {
                        what: $what,
                        given: text.chars().take(200).collect(),
                        rule: $rule,
                    })
                }
            }
        }

        impl FromStr for $name {
            type Err = InvalidValue;
            fn from_str(text: &str) -> Result<Self, InvalidValue> {
                $name::try_from(text.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "type": "string",
                    "pattern": $pattern,
                    "description": $rule,
                })
            }
        }
    };
}

/// An identifier safe as a path component and a URL path segment.
pub fn is_plain_id(text: &str) -> bool {
    text.len() <= 128
        && text
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphanumeric)
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

const PLAIN_ID: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$";

checked_string!(
    /// A run's id (managed mode): it names directories on runners and URL
    /// segments of the API.
    RunId,
    "run id",
    "1 to 128 of [A-Za-z0-9._-], starting with a letter or digit",
    PLAIN_ID,
    is_plain_id
);

checked_string!(
    /// An operation's id within its run (managed mode).
    OpId,
    "operation id",
    "1 to 128 of [A-Za-z0-9._-], starting with a letter or digit",
    PLAIN_ID,
    is_plain_id
);

checked_string!(
    /// A SHA-256 as lower-case hex: what artifacts, builds and manifests
    /// are named by.
    Sha256,
    "sha256",
    "64 lower-case hex digits",
    "^[0-9a-f]{64}$",
    |text| text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
);

checked_string!(
    /// A path relative to a workspace: no root, no empty, `.` or `..`
    /// component, no NUL; at most 4096 bytes.
    RelPath,
    "path",
    "relative, without empty, . or .. components, at most 4096 bytes",
    "^[^/]",
    |path| {
        !path.is_empty()
            && path.len() <= 4096
            && !path.starts_with('/')
            && path
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
    }
);

checked_string!(
    /// A persistent volume's name, unique within its org: it names URL
    /// segments of the API.
    VolumeName,
    "volume name",
    "1 to 64 of [a-z0-9._-], starting with a letter or digit",
    "^[a-z0-9][a-z0-9._-]{0,63}$",
    |name| {
        name.len() <= 64
            && name
                .as_bytes()
                .first()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    }
);

impl RunId {
    /// A fresh random id (`run_` and 32 hex digits).
    pub fn random() -> RunId {
        RunId(crate::random::new_id("run_"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_holds_only_what_its_rule_allows() {
        for good in ["run-1", "a", "R_2.x", "0"] {
            assert!(good.parse::<RunId>().is_ok(), "{good}");
            assert!(good.parse::<OpId>().is_ok(), "{good}");
        }
        let long = "a".repeat(129);
        for bad in [
            "", ".", "..", ".hidden", "-x", "a/b", "a b", "a?b", "é", "a\0", &long,
        ] {
            assert!(bad.parse::<RunId>().is_err(), "{bad:?}");
            assert!(bad.parse::<OpId>().is_err(), "{bad:?}");
        }
        assert!("ab".repeat(32).parse::<Sha256>().is_ok());
        for bad in [
            "AB".repeat(32),
            "ab".repeat(31),
            "g".repeat(64),
            String::new(),
        ] {
            assert!(bad.parse::<Sha256>().is_err(), "{bad}");
        }
        for good in ["a", "input/data.csv", "a/.b/c..d"] {
            assert!(good.parse::<RelPath>().is_ok(), "{good}");
        }
        for bad in ["", "/etc", "a//b", "a/./b", "../x", "a/..", "a\0b", "a/"] {
            assert!(bad.parse::<RelPath>().is_err(), "{bad:?}");
        }
        assert!("a".repeat(4097).parse::<RelPath>().is_err());
        for good in ["cache", "model-1", "a.b_c", "0"] {
            assert!(good.parse::<VolumeName>().is_ok(), "{good}");
        }
        for bad in ["", "Cache", "-x", ".x", "a/b", "a b", &"a".repeat(65)] {
            assert!(bad.parse::<VolumeName>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deserialising_checks_and_says_why() {
        let err = serde_json::from_str::<RunId>("\"../x\"")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("run id \"../x\": 1 to 128"), "{err}");
        let id: RunId = serde_json::from_str("\"r-1\"").unwrap_or_else(|_| RunId::random());
        assert_eq!(serde_json::to_string(&id).ok().as_deref(), Some("\"r-1\""));
        assert!(RunId::random().as_str().starts_with("run_"));
    }
}
