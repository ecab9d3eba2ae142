//! Calls made with an org's bearer token (an admin or agent token).

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ClientError;
use crate::http::{Answer, Http};

/// A client of one control plane for one org.
pub struct OrgClient {
    http: Http,
    authorization: String,
}

impl OrgClient {
    /// `token` is the org's admin or agent token; it is sent as a bearer
    /// token and never shown in errors.
    pub fn new(base: &str, token: &str, timeout: Duration) -> OrgClient {
        OrgClient::with_roots(base, token, timeout, None)
    }

    /// [`OrgClient::new`], trusting only `roots` for `https://` when given.
    pub fn with_roots(
        base: &str,
        token: &str,
        timeout: Duration,
        roots: Option<&crate::CaRoots>,
    ) -> OrgClient {
        OrgClient {
            http: Http::with_roots(base, timeout, roots),
            authorization: format!("Bearer {}", token.trim()),
        }
    }

    pub fn base(&self) -> &str {
        self.http.base()
    }

    /// `GET path` as its raw answer, whatever its status.
    pub fn get_answer(&self, path: &str) -> Result<Answer, ClientError> {
        self.http.send(
            "GET",
            path,
            &[("authorization", self.authorization.clone())],
            None,
        )
    }

    /// `POST path` with `body` as its raw answer, whatever its status.
    pub fn post_answer<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<Answer, ClientError> {
        self.send_json("POST", path, body)
    }

    /// `PUT path` with `body` as its raw answer, whatever its status.
    pub fn put_answer<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<Answer, ClientError> {
        self.send_json("PUT", path, body)
    }

    fn send_json<B: Serialize + ?Sized>(
        &self,
        method: &str,
        path: &str,
        body: &B,
    ) -> Result<Answer, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Encode {
            what: format!("{method} {path}"),
            message: e.to_string(),
        })?;
        self.http.send(
            method,
            path,
            &[("authorization", self.authorization.clone())],
            Some(&bytes),
        )
    }

    /// `POST path` without a body (`/finish`, `/revoke`...), as its raw
    /// answer, whatever its status.
    pub fn post_empty_answer(&self, path: &str) -> Result<Answer, ClientError> {
        self.http.send(
            "POST",
            path,
            &[("authorization", self.authorization.clone())],
            None,
        )
    }

    /// `GET path`, answered as `T`.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.get_answer(path)?.json(&format!("GET {path}"))
    }

    /// `POST path` with `body`, answered as `T`.
    pub fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.post_answer(path, body)?.json(&format!("POST {path}"))
    }
}
