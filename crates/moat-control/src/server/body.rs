//! Request bodies. Every JSON body is an object of its documented shape:
//! serde's derived structs also accept a JSON array (the fields in order),
//! so `["arr-1"]` would have created run `arr-1`. Bodies are read as a
//! [`Value`] and deserialized through [`Strict`], which refuses anything but
//! an object wherever a struct is expected, at any depth.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use serde_json::Value;

use super::error::{ApiError, ApiResult};

type Error = serde_json::Error;

/// `body` as a `T`, if it is a JSON object of that shape.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, not {}",
            kind(&value)
        )));
    }
    T::deserialize(Strict(&value)).map_err(|e| ApiError::bad_request(format!("request body: {e}")))
}

/// A body that may be left out (empty); when given, it is an object.
pub fn parse_optional<T: DeserializeOwned + Default>(body: &[u8]) -> ApiResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse(body)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The JSON body of a request (`Content-Type: application/json`), as a `T`.
pub struct JsonObject<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonObject<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .is_some_and(|v| v == "application/json" || v.ends_with("+json"));
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the request body must be JSON (Content-Type: application/json)",
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|e| ApiError::new(e.status(), "bad_request", e.body_text()))?;
        parse(&bytes).map(JsonObject)
    }
}

/// Deserializes from a [`Value`] like `serde_json` does, except that a
/// struct (or a struct variant) must be an object.
struct Strict<'de>(&'de Value);

fn unexpected(value: &Value) -> de::Unexpected<'_> {
    match value {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(_) => de::Unexpected::Other("a number"),
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

impl<'de> de::Deserializer<'de> for Strict<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => visitor.visit_u64(u),
                (None, Some(i), _) => visitor.visit_i64(i),
                (None, None, Some(f)) => visitor.visit_f64(f),
                _ => Err(de::Error::custom("a number out of range")),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => {
                let mut seq = Seq(items.iter());
                let out = visitor.visit_seq(&mut seq)?;
                if seq.0.len() == 0 {
                    Ok(out)
                } else {
                    Err(de::Error::invalid_length(items.len(), &"fewer elements"))
                }
            }
            Value::Object(map) => visitor.visit_map(Map {
                entries: map.iter(),
                value: None,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            other => Err(de::Error::invalid_type(unexpected(other), &"a JSON object")),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(BorrowedStrDeserializer::<Error>::new(s)),
            Value::Object(map) if map.len() == 1 => match map.iter().next() {
                Some((variant, value)) => visitor.visit_enum(Enum { variant, value }),
                None => Err(de::Error::custom("an empty enum")),
            },
            other => Err(de::Error::invalid_type(
                unexpected(other),
                &"a string or an object with one key",
            )),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

struct Seq<'de>(std::slice::Iter<'de, Value>);

impl<'de> de::SeqAccess<'de> for Seq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Strict(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Map<'de> {
    entries: serde_json::map::Iter<'de>,
    value: Option<&'de Value>,
}

impl<'de> de::MapAccess<'de> for Map<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.entries.next() {
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(BorrowedStrDeserializer::new(key))
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(Strict(value)),
            None => Err(de::Error::custom("a value without its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

struct Enum<'de> {
    variant: &'de str,
    value: &'de Value,
}

impl<'de> de::EnumAccess<'de> for Enum<'de> {
    type Error = Error;
    type Variant = Strict<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Strict<'de>), Error> {
        let variant = seed.deserialize(BorrowedStrDeserializer::<Error>::new(self.variant))?;
        Ok((variant, Strict(self.value)))
    }
}

impl<'de> de::VariantAccess<'de> for Strict<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(unexpected(other), &"null")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => de::Deserializer::deserialize_any(self, visitor),
            other => Err(de::Error::invalid_type(unexpected(other), &"an array")),
        }
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug, Default, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Inner {
        path: String,
        #[serde(default)]
        size: Option<u64>,
    }

    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Off,
        Limit { max: i64 },
    }

    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Outer {
        id: String,
        #[serde(default)]
        inner: Vec<Inner>,
        #[serde(default)]
        mode: Option<Mode>,
        #[serde(default)]
        data: Value,
        #[serde(default)]
        ratio: f64,
    }

    #[test]
    fn objects_of_the_shape_parse_like_serde_json() {
        let body =
            br#"{"id": "a", "inner": [{"path": "p", "size": 3}], "mode": {"limit": {"max": -2}},
                        "data": {"x": [1, -1, 1.5, null, "s"]}, "ratio": 2}"#;
        let got: Outer = parse(body).unwrap();
        let want: Outer = serde_json::from_slice(body).unwrap();
        assert_eq!(got, want);
        let got: Outer = parse(br#"{"id": "b", "mode": "off"}"#).unwrap();
        assert_eq!(got.mode, Some(Mode::Off));
    }

    #[test]
    fn arrays_and_scalars_are_not_structs_at_any_depth() {
        for body in [
            &br#"["a"]"#[..],
            br#""a""#,
            b"1",
            b"null",
            br#"{"id": "a", "inner": [["p", 3]]}"#,
            br#"{"id": "a", "mode": {"limit": [5]}}"#,
            br#"{"id": "a", "extra": 1}"#,
            b"{",
        ] {
            let err = parse::<Outer>(body).map(|_| ()).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{body:?}");
        }
        assert_eq!(parse_optional::<Inner>(b" \n").unwrap(), Inner::default());
        assert!(parse_optional::<Inner>(b"[]").is_err());
    }
}
