//! The API's routes, registered through one table that remembers what it
//! serves: the router and the OpenAPI document are checked against each
//! other from this list, in both directions.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::handler::Handler;
use axum::routing::{MethodFilter, MethodRouter};

use super::AppState;

/// An HTTP method, as the document names it and as the router filters it.
#[derive(Clone, Copy)]
pub struct Method(pub &'static str, MethodFilter);

pub const GET: Method = Method("get", MethodFilter::GET);
pub const POST: Method = Method("post", MethodFilter::POST);
pub const PUT: Method = Method("put", MethodFilter::PUT);
pub const DELETE: Method = Method("delete", MethodFilter::DELETE);
/// Every method a program's HTTP server may answer (a run's ports): the
/// document lists each.
pub const ANY: Method = Method(
    "any",
    MethodFilter::GET
        .or(MethodFilter::HEAD)
        .or(MethodFilter::POST)
        .or(MethodFilter::PUT)
        .or(MethodFilter::DELETE)
        .or(MethodFilter::PATCH)
        .or(MethodFilter::OPTIONS),
);

/// Routes being registered.
#[derive(Default)]
pub struct Routes {
    paths: BTreeMap<&'static str, MethodRouter<Arc<AppState>>>,
    served: Vec<(&'static str, &'static str)>,
}

impl Routes {
    /// Serves `method path` with `handler`.
    pub fn on<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Routes
    where
        H: Handler<T, Arc<AppState>>,
        T: 'static,
    {
        let Method(name, filter) = method;
        let route = self.paths.remove(path).unwrap_or_default();
        self.paths.insert(path, route.on(filter, handler));
        self.served.push((name, path));
        self
    }

    /// `(method, path)` of every route registered, in order.
    pub fn served(&self) -> &[(&'static str, &'static str)] {
        &self.served
    }

    pub fn into_router(self) -> Router<Arc<AppState>> {
        self.paths
            .into_iter()
            .fold(Router::new(), |router, (path, route)| {
                router.route(path, route)
            })
    }
}
