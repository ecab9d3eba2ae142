//! Request bodies. Every JSON body is an object of its documented shape:
//! serde's derived structs also accept a JSON array (the fields in order),
//! so `["arr-1"]` would have created run `arr-1`. Bodies are read as a
//! [`Value`] and deserialized through `moat_core::strict`, which refuses
//! anything but an object wherever a struct is expected, at any depth.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{ApiError, ApiResult};

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
    moat_core::strict::from_value(&value)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))
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
