//! Runner enrolment by workload identity: a runner registers with a token
//! that an identity provider the org trusts signed for it — on Kubernetes,
//! the pod's projected service-account token, with an audience of Moat's
//! own — instead of a single-use bootstrap token. The org enrols the
//! provider once (its issuer, the audience, the subject its runners carry,
//! and its public keys as a JWKS); every runner of every node then
//! registers at every start without a person writing a token.
//!
//! Only what such tokens use is accepted: compact JWS, `RS256` or `ES256`,
//! with `exp`, at most [`MAX_LIFETIME_MS`] long. A token without an expiry
//! (Kubernetes' legacy Secret-based tokens) is refused: it would be a
//! password that never runs out.

use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;

const B64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Clock difference tolerated on `exp` and `nbf`.
pub const LEEWAY_MS: i64 = 60_000;

/// The longest validity a token may claim (`exp` − `iat`): the kubelet's
/// projected tokens live 10 minutes to a few hours.
pub const MAX_LIFETIME_MS: i64 = 24 * 3_600_000;

/// Tokens longer than this are refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The latest time a claim may name, 9999-12-31T23:59:59Z: times are
/// checked against it before any arithmetic, so none can overflow, and
/// every accepted expiry can be written as RFC 3339.
const MAX_TIME_S: i64 = 253_402_300_799;

/// A JWKS key the enrolment accepts.
#[derive(Debug, Clone)]
struct Key {
    kid: Option<String>,
    material: Material,
}

#[derive(Debug, Clone)]
enum Material {
    /// RS256: modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// ES256: the uncompressed P-256 point (0x04 ‖ x ‖ y).
    P256(Vec<u8>),
}

/// An identity provider's public keys (a JWKS), parsed and checked.
#[derive(Debug, Clone)]
pub struct Jwks {
    keys: Vec<Key>,
}

/// Why a JWKS was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwksError {
    #[error("jwks: an object with a non-empty `keys` array is expected")]
    Shape,
    #[error("jwks: keys[{index}]: {problem}")]
    Key { index: usize, problem: String },
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

fn field(value: Option<&String>, name: &str) -> Result<Vec<u8>, String> {
    let text = value.ok_or_else(|| format!("`{name}` missing"))?;
    B64URL
        .decode(text)
        .map_err(|_| format!("`{name}` is not base64url without padding"))
}

fn parse_key(raw: RawJwk) -> Result<Key, String> {
    if raw.usage.as_deref().is_some_and(|u| u != "sig") {
        return Err(format!("`use` is {:?}, not \"sig\"", raw.usage));
    }
    let material = match raw.kty.as_str() {
        "RSA" => {
            if raw.alg.as_deref().is_some_and(|a| a != "RS256") {
                return Err(format!("RSA key with alg {:?}: only RS256", raw.alg));
            }
            let n = field(raw.n.as_ref(), "n")?;
            let e = field(raw.e.as_ref(), "e")?;
            if n.len() < 256 {
                return Err("RSA modulus shorter than 2048 bits".into());
            }
            Material::Rsa { n, e }
        }
        "EC" => {
            if raw.crv.as_deref() != Some("P-256") {
                return Err(format!("EC key on {:?}: only P-256", raw.crv));
            }
            if raw.alg.as_deref().is_some_and(|a| a != "ES256") {
                return Err(format!("EC key with alg {:?}: only ES256", raw.alg));
            }
            let (x, y) = (field(raw.x.as_ref(), "x")?, field(raw.y.as_ref(), "y")?);
            if x.len() != 32 || y.len() != 32 {
                return Err("P-256 coordinates must be 32 bytes each".into());
            }
            let mut point = vec![4u8];
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            Material::P256(point)
        }
        other => return Err(format!("kty {other:?}: only RSA and EC")),
    };
    Ok(Key {
        kid: raw.kid,
        material,
    })
}

impl Jwks {
    /// The keys of a JWKS document (`{"keys": [...]}`), each checked.
    pub fn parse(value: &Value) -> Result<Jwks, JwksError> {
        let keys = value
            .get("keys")
            .and_then(Value::as_array)
            .filter(|k| !k.is_empty())
            .ok_or(JwksError::Shape)?;
        let keys = keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                serde_json::from_value::<RawJwk>(key.clone())
                    .map_err(|e| e.to_string())
                    .and_then(parse_key)
                    .map_err(|problem| JwksError::Key { index, problem })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Jwks { keys })
    }
}

/// What an enrolment accepts.
#[derive(Debug, Clone)]
pub struct Trust {
    pub issuer: String,
    pub audience: String,
    pub subject: String,
    pub jwks: Jwks,
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("not a compact JWS (three base64url parts)")]
    Malformed,
    #[error("the token's header or claims are not the expected JSON: {0}")]
    Claims(String),
    #[error("algorithm {0:?}: only RS256 and ES256 are accepted")]
    Algorithm(String),
    #[error("no key of the enrolment matches (kid {0:?}, alg {1})")]
    UnknownKey(Option<String>, String),
    #[error("the signature does not verify")]
    Signature,
    #[error("issuer {0:?} is not the enrolment's")]
    Issuer(String),
    #[error("audience {0:?} does not include the enrolment's")]
    Audience(Vec<String>),
    #[error("subject {0:?} is not the enrolment's")]
    Subject(String),
    #[error("the token has no expiry (exp): a token that never expires is refused")]
    NoExpiry,
    #[error("the token expired at {0} (ms since the epoch)")]
    Expired(i64),
    #[error("the token is not valid before {0} (ms since the epoch)")]
    NotYetValid(i64),
    #[error("the token claims to live {0} s; at most {max} s", max = MAX_LIFETIME_MS / 1000)]
    TooLong(i64),
    #[error("{0}: {1} is not a time from 1970 to 9999")]
    Time(&'static str, i64),
}

/// A NumericDate claim in milliseconds, refused outside 1970..=9999.
fn millis(name: &'static str, seconds: Option<i64>) -> Result<Option<i64>, TokenError> {
    match seconds {
        None => Ok(None),
        Some(s) if (0..=MAX_TIME_S).contains(&s) => Ok(Some(s * 1000)),
        Some(s) => Err(TokenError::Time(name, s)),
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    /// Extensions the verifier must understand (RFC 7515 §4.1.11): none is.
    #[serde(default)]
    crit: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct RawClaims {
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    aud: Option<Audience>,
    #[serde(default)]
    exp: Option<i64>,
    #[serde(default)]
    nbf: Option<i64>,
    #[serde(default)]
    iat: Option<i64>,
    #[serde(default)]
    jti: Option<String>,
    #[serde(default, rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

#[derive(Deserialize, Default)]
struct KubernetesClaims {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    pod: Option<NamedObject>,
    #[serde(default)]
    node: Option<NamedObject>,
}

#[derive(Deserialize)]
struct NamedObject {
    name: String,
    #[serde(default)]
    uid: Option<String>,
}

/// What a verified token says about the runner that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub subject: String,
    pub expires_ms: i64,
    pub token_id: Option<String>,
    /// Kubernetes' `kubernetes.io` claims, when present.
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub pod_uid: Option<String>,
    pub node: Option<String>,
}

/// Whether `token` has the shape of a JWT (a bootstrap token has not).
pub fn looks_like_jwt(token: &str) -> bool {
    token.starts_with("eyJ") && token.bytes().filter(|b| *b == b'.').count() == 2
}

struct Parts<'a> {
    signed: &'a str,
    header: Header,
    claims: RawClaims,
    signature: Vec<u8>,
}

fn split(token: &str) -> Result<Parts<'_>, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Malformed);
    }
    let mut pieces = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (pieces.next(), pieces.next(), pieces.next(), pieces.next())
    else {
        return Err(TokenError::Malformed);
    };
    let decode = |part: &str| B64URL.decode(part).map_err(|_| TokenError::Malformed);
    let json = |bytes: Vec<u8>| -> Result<Value, TokenError> {
        serde_json::from_slice(&bytes).map_err(|e| TokenError::Claims(e.to_string()))
    };
    let header: Header = serde_json::from_value(json(decode(header)?)?)
        .map_err(|e| TokenError::Claims(format!("header: {e}")))?;
    let claims: RawClaims = serde_json::from_value(json(decode(claims)?)?)
        .map_err(|e| TokenError::Claims(format!("claims: {e}")))?;
    let signed_len = token.len() - signature.len() - 1;
    Ok(Parts {
        signed: &token[..signed_len],
        header,
        claims,
        signature: decode(signature)?,
    })
}

/// What a token says it is, unverified: which enrolments to try, and
/// which org a refusal concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub issuer: String,
    pub audiences: Vec<String>,
    pub subject: String,
}

impl Claimed {
    /// Whether the token was meant for `trust` (it names its audience and
    /// subject), whether or not it verifies.
    pub fn aimed_at(&self, trust: &Trust) -> bool {
        self.subject == trust.subject && self.audiences.contains(&trust.audience)
    }
}

fn audiences(aud: Option<Audience>) -> Vec<String> {
    match aud {
        Some(Audience::One(a)) => vec![a],
        Some(Audience::Many(a)) => a,
        None => Vec::new(),
    }
}

pub fn claimed(token: &str) -> Result<Claimed, TokenError> {
    let claims = split(token)?.claims;
    Ok(Claimed {
        issuer: claims
            .iss
            .ok_or_else(|| TokenError::Claims("no issuer (iss)".into()))?,
        audiences: audiences(claims.aud),
        subject: claims.sub.unwrap_or_default(),
    })
}

fn verifies(material: &Material, alg: &str, message: &[u8], signature: &[u8]) -> bool {
    match (material, alg) {
        (Material::Rsa { n, e }, "RS256") => RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, signature)
            .is_ok(),
        (Material::P256(point), "ES256") => {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, signature)
                .is_ok()
        }
        _ => false,
    }
}

fn key_fits(material: &Material, alg: &str) -> bool {
    matches!(
        (material, alg),
        (Material::Rsa { .. }, "RS256") | (Material::P256(_), "ES256")
    )
}

/// Checks `token` against `trust` at `now_ms`: signature first, then
/// issuer, audience, subject and times.
pub fn verify(token: &str, trust: &Trust, now_ms: i64) -> Result<Verified, TokenError> {
    let parts = split(token)?;
    let alg = parts.header.alg.as_str();
    if parts.header.crit.is_some() {
        return Err(TokenError::Claims(
            "header: critical extensions (crit) are not supported".into(),
        ));
    }
    if alg != "RS256" && alg != "ES256" {
        return Err(TokenError::Algorithm(alg.to_owned()));
    }
    let candidates: Vec<&Key> = trust
        .jwks
        .keys
        .iter()
        .filter(|k| key_fits(&k.material, alg))
        .filter(|k| parts.header.kid.is_none() || k.kid == parts.header.kid)
        .collect();
    if candidates.is_empty() {
        return Err(TokenError::UnknownKey(parts.header.kid.clone(), alg.into()));
    }
    if !candidates
        .iter()
        .any(|k| verifies(&k.material, alg, parts.signed.as_bytes(), &parts.signature))
    {
        return Err(TokenError::Signature);
    }
    let claims = parts.claims;
    let issuer = claims.iss.unwrap_or_default();
    if issuer != trust.issuer {
        return Err(TokenError::Issuer(issuer));
    }
    let audiences = audiences(claims.aud);
    if !audiences.contains(&trust.audience) {
        return Err(TokenError::Audience(audiences));
    }
    let subject = claims.sub.unwrap_or_default();
    if subject != trust.subject {
        return Err(TokenError::Subject(subject));
    }
    // All three are within 1970..=9999 from here on, and `now_ms` is the
    // control plane's clock: no sum or difference below can overflow.
    let exp = millis("exp", claims.exp)?.ok_or(TokenError::NoExpiry)?;
    let nbf = millis("nbf", claims.nbf)?;
    let iat = millis("iat", claims.iat)?;
    if exp + LEEWAY_MS <= now_ms {
        return Err(TokenError::Expired(exp));
    }
    if let Some(nbf) = nbf
        && nbf > now_ms + LEEWAY_MS
    {
        return Err(TokenError::NotYetValid(nbf));
    }
    // Measured from the earlier of its issue and now, so that neither a
    // far-past `iat` nor a missing one lets a long token through.
    let from = iat.map_or(now_ms, |iat| iat.min(now_ms));
    if exp - from > MAX_LIFETIME_MS {
        return Err(TokenError::TooLong((exp - from) / 1000));
    }
    let k8s = claims.kubernetes.unwrap_or_default();
    let (pod, pod_uid) = k8s.pod.map_or((None, None), |p| (Some(p.name), p.uid));
    Ok(Verified {
        subject,
        expires_ms: exp,
        token_id: claims.jti,
        namespace: k8s.namespace,
        pod,
        pod_uid,
        node: k8s.node.map(|n| n.name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    use serde_json::json;

    const NOW: i64 = 1_900_000_000_000;

    fn key_pair() -> EcdsaKeyPair {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap()
    }

    fn jwk(pair: &EcdsaKeyPair, kid: &str) -> Value {
        let point = pair.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
               "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..])})
    }

    fn mint(pair: &EcdsaKeyPair, header: Value, claims: Value) -> String {
        let signed = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let sig = pair.sign(&SystemRandom::new(), signed.as_bytes()).unwrap();
        format!("{signed}.{}", B64URL.encode(sig.as_ref()))
    }

    fn claims() -> Value {
        json!({"iss": "https://cluster.example", "aud": ["moat-runner-enrolment"],
               "sub": "system:serviceaccount:moat-runner:moat-runner",
               "iat": NOW / 1000, "nbf": NOW / 1000, "exp": NOW / 1000 + 600,
               "jti": "j1",
               "kubernetes.io": {"namespace": "moat-runner",
                                 "pod": {"name": "moat-runner-x", "uid": "u1"},
                                 "node": {"name": "node-a", "uid": "u2"},
                                 "serviceaccount": {"name": "moat-runner", "uid": "u3"}}})
    }

    fn trust(pair: &EcdsaKeyPair) -> Trust {
        Trust {
            issuer: "https://cluster.example".into(),
            audience: "moat-runner-enrolment".into(),
            subject: "system:serviceaccount:moat-runner:moat-runner".into(),
            jwks: Jwks::parse(&json!({"keys": [jwk(pair, "k1")]})).unwrap(),
        }
    }

    fn with(edit: impl FnOnce(&mut Value)) -> Value {
        let mut c = claims();
        edit(&mut c);
        c
    }

    #[test]
    fn a_projected_token_verifies_and_tells_its_pod_and_node() {
        let pair = key_pair();
        let token = mint(&pair, json!({"alg": "ES256", "kid": "k1"}), claims());
        assert!(looks_like_jwt(&token));
        let claimed = claimed(&token).unwrap();
        assert_eq!(claimed.issuer, "https://cluster.example");
        assert!(claimed.aimed_at(&trust(&pair)));
        let v = verify(&token, &trust(&pair), NOW).unwrap();
        assert_eq!(v.node.as_deref(), Some("node-a"));
        assert_eq!(v.pod.as_deref(), Some("moat-runner-x"));
        assert_eq!(v.pod_uid.as_deref(), Some("u1"));
        assert_eq!(v.expires_ms, NOW + 600_000);
    }

    #[test]
    fn each_wrong_claim_is_refused_with_its_reason() {
        let pair = key_pair();
        let t = trust(&pair);
        let header = json!({"alg": "ES256", "kid": "k1"});
        let check = |claims: Value| verify(&mint(&pair, header.clone(), claims), &t, NOW);
        assert!(matches!(
            check(with(|c| c["iss"] = json!("https://other"))),
            Err(TokenError::Issuer(_))
        ));
        assert!(matches!(
            check(with(|c| c["aud"] = json!("https://kubernetes.default.svc"))),
            Err(TokenError::Audience(_))
        ));
        assert!(matches!(
            check(with(
                |c| c["sub"] = json!("system:serviceaccount:default:default")
            )),
            Err(TokenError::Subject(_))
        ));
        assert!(matches!(
            check(with(|c| {
                c.as_object_mut().unwrap().remove("exp");
            })),
            Err(TokenError::NoExpiry)
        ));
        assert!(matches!(
            check(with(|c| c["exp"] = json!(NOW / 1000 - 61))),
            Err(TokenError::Expired(_))
        ));
        assert!(matches!(
            check(with(|c| c["nbf"] = json!(NOW / 1000 + 120))),
            Err(TokenError::NotYetValid(_))
        ));
        assert!(matches!(
            check(with(|c| c["exp"] = json!(NOW / 1000 + 365 * 86_400))),
            Err(TokenError::TooLong(_))
        ));
        // Extreme times are refused before any arithmetic (no overflow).
        for (claim, value) in [
            ("exp", json!(i64::MAX)),
            ("iat", json!(-9_300_000_000_000_000_i64)),
            ("nbf", json!(-1)),
            ("exp", json!(253_402_300_800_i64)),
        ] {
            assert!(
                matches!(
                    check(with(|c| c[claim] = value.clone())),
                    Err(TokenError::Time(..))
                ),
                "{claim} {value}"
            );
        }
        assert!(matches!(
            verify(
                &mint(
                    &pair,
                    json!({"alg": "ES256", "kid": "k1", "crit": ["b64"]}),
                    claims()
                ),
                &t,
                NOW
            ),
            Err(TokenError::Claims(_))
        ));
        // Within the leeway, an expiry just past still passes.
        assert!(check(with(|c| c["exp"] = json!(NOW / 1000 - 30))).is_ok());
    }

    #[test]
    fn a_foreign_key_a_forged_body_or_another_algorithm_is_refused() {
        let pair = key_pair();
        let t = trust(&pair);
        let other = key_pair();
        let token = mint(&other, json!({"alg": "ES256", "kid": "k1"}), claims());
        assert_eq!(verify(&token, &t, NOW), Err(TokenError::Signature));
        let token = mint(&pair, json!({"alg": "ES256", "kid": "k2"}), claims());
        assert!(matches!(
            verify(&token, &t, NOW),
            Err(TokenError::UnknownKey(..))
        ));
        // A body swapped under a valid signature.
        let good = mint(&pair, json!({"alg": "ES256", "kid": "k1"}), claims());
        let evil = B64URL.encode(with(|c| c["sub"] = json!("x")).to_string());
        let mut pieces: Vec<&str> = good.split('.').collect();
        pieces[1] = &evil;
        assert_eq!(
            verify(&pieces.join("."), &t, NOW),
            Err(TokenError::Signature)
        );
        for alg in ["none", "HS256", "RS512"] {
            let token = mint(&pair, json!({"alg": alg}), claims());
            assert!(
                matches!(verify(&token, &t, NOW), Err(TokenError::Algorithm(_))),
                "{alg}"
            );
        }
        for bad in ["", "a.b", "a.b.c.d", "eyJ.eyJ.%%%", "moat_0123"] {
            assert!(verify(bad, &t, NOW).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_jwks_must_hold_signing_keys_of_the_accepted_kinds() {
        let pair = key_pair();
        assert_eq!(Jwks::parse(&json!({})).unwrap_err(), JwksError::Shape);
        assert_eq!(
            Jwks::parse(&json!({"keys": []})).unwrap_err(),
            JwksError::Shape
        );
        for bad in [
            json!({"kty": "oct", "k": "AAAA"}),
            json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"}),
            json!({"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"}),
            with_use(jwk(&pair, "k"), "enc"),
        ] {
            assert!(
                matches!(
                    Jwks::parse(&json!({"keys": [bad.clone()]})),
                    Err(JwksError::Key { index: 0, .. })
                ),
                "{bad}"
            );
        }
    }

    fn with_use(mut key: Value, usage: &str) -> Value {
        key["use"] = json!(usage);
        key
    }
}
