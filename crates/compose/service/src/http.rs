//! The HTTP endpoint of a running service: `GET /metrics` (OpenMetrics text when asked for,
//! else the classic text format), and for its cached
//! LUNs `GET /status` (JSON) and `POST /drain` (destage everything, answer once the remotes hold
//! it all). Served by axum over hyper.
//!
//! `/status` is `{"luns": [STATUS, ...]}`, one `stics_cache::Status` per cached LUN with its
//! `target` and `lun` added. With exactly one cached LUN (a gateway started from flags), that
//! LUN's fields are also at the top level, where clients of a single-LUN gateway read them.
//! `POST /drain` answers 200 with the same JSON once every cache is drained, and 503 with
//! `{"error", "status"}` when any drain ends with an error (each error names its LUN).
//!
//! An SG's `/status` has `"journals"`: for each journal it serves, what it has done and its lock
//! server's `tokens` (held by kind, grants, revokes, releases, breaks, and every segment someone
//! waits for with the holders in the way and how long the SG has not heard from them).
//! `POST /break?segment=N[&journal=I]` is the operator's way past a holder that does not answer:
//! it takes the segment's tokens from the holders asked to give them up (their unshipped writes
//! are refused from then on) and answers what it broke.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use prometheus_client::registry::Registry;
use serde_json::Value;
use stics_target::Stats;
use tokio::net::TcpListener;

use crate::service::ServedCache;

/// What the handlers share: the registry, registered once, and the caches.
struct Shared {
    registry: Registry,
    caches: Vec<ServedCache>,
    journals: Vec<Arc<stics_journal::JournalDev>>,
}

/// The endpoint over one service; [`Endpoint::serve`] runs it.
#[derive(Clone)]
pub struct Endpoint {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("caches", &self.shared.caches).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// The endpoint over a target's `stats`, its cached LUNs and the SG journals it serves.
    pub fn new(stats: Arc<Stats>, caches: Vec<ServedCache>, journals: Vec<Arc<stics_journal::JournalDev>>) -> Endpoint {
        let registry = crate::metrics::registry(stats, caches.clone(), journals.clone());
        Endpoint { shared: Arc::new(Shared { registry, caches, journals }) }
    }

    /// The routes, for a caller that serves them itself.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/metrics", get(metrics))
            .route("/status", get(status))
            .route("/drain", post(drain))
            .route("/break", post(break_segment))
            .fallback(not_found)
            .with_state(Arc::clone(&self.shared))
    }

    /// The metrics as OpenMetrics text, as `GET /metrics` answers.
    pub fn metrics_text(&self) -> String {
        crate::metrics::encode(&self.shared.registry)
    }

    /// The caches' and journals' status as `GET /status` answers.
    pub fn status_json(&self) -> Value {
        full_status(&self.shared)
    }

    /// Serves the routes on `listener` until the process ends or the listener fails.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).await
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics text to a scraper that asks for it (Prometheus does), the classic text format
/// to any other (curl, promtool), as Prometheus' own client libraries negotiate.
async fn metrics(State(s): State<Arc<Shared>>, headers: axum::http::HeaderMap) -> Response {
    let text = crate::metrics::encode(&s.registry);
    let wants_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if wants_openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response()
    } else {
        ([(header::CONTENT_TYPE, CLASSIC)], crate::metrics::classic(&text)).into_response()
    }
}

fn json(code: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_string_pretty(v).unwrap_or_default();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn no_caches() -> Response {
    (StatusCode::NOT_FOUND, "no cached LUN here: /drain is a gateway's\n").into_response()
}

/// One cache's status with its target and LUN.
fn lun_status(c: &ServedCache) -> Value {
    let mut v = serde_json::to_value(c.cache.status()).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        if let Some(s) = &c.shared {
            o.insert("tokens".into(), serde_json::to_value(s.token_stats()).unwrap_or(Value::Null));
            o.insert("quarantine".into(), serde_json::to_value(s.quarantined()).unwrap_or(Value::Null));
        }
        o.insert("target".into(), Value::from(c.target.clone()));
        o.insert("lun".into(), Value::from(c.lun));
    }
    v
}

fn status_json(caches: &[ServedCache]) -> Value {
    let luns: Vec<Value> = caches.iter().map(lun_status).collect();
    match luns.as_slice() {
        [one] => {
            let mut top = one.clone();
            if let Some(o) = top.as_object_mut() {
                o.insert("luns".into(), Value::Array(luns));
            }
            top
        }
        _ => serde_json::json!({ "luns": luns }),
    }
}

/// One journal's status with its lock server's.
fn journal_status(i: usize, j: &stics_journal::JournalDev) -> Value {
    let mut v = serde_json::to_value(j.status()).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("journal".into(), Value::from(i));
        o.insert("tokens".into(), serde_json::to_value(j.token_status()).unwrap_or(Value::Null));
    }
    v
}

fn full_status(s: &Shared) -> Value {
    let mut v = if s.caches.is_empty() { serde_json::json!({}) } else { status_json(&s.caches) };
    if let Some(o) = v.as_object_mut().filter(|_| !s.journals.is_empty()) {
        let journals = s.journals.iter().enumerate().map(|(i, j)| journal_status(i, j)).collect();
        o.insert("journals".into(), Value::Array(journals));
    }
    v
}

async fn status(State(s): State<Arc<Shared>>) -> Response {
    if s.caches.is_empty() && s.journals.is_empty() {
        return (StatusCode::NOT_FOUND, "no cached LUN or SG journal here: nothing has a status\n").into_response();
    }
    json(StatusCode::OK, &full_status(&s))
}

async fn break_segment(State(s): State<Arc<Shared>>, uri: axum::http::Uri) -> Response {
    let q: std::collections::HashMap<&str, &str> =
        uri.query().unwrap_or_default().split('&').filter_map(|kv| kv.split_once('=')).collect();
    let n = |k: &str| q.get(k).map(|v| v.parse::<u64>());
    let Some(Ok(segment)) = n("segment") else {
        return (StatusCode::BAD_REQUEST, "POST /break?segment=N[&journal=I]: N and I are numbers\n").into_response();
    };
    let journal = match n("journal") {
        None => 0,
        Some(Ok(i)) => i as usize,
        Some(Err(_)) => return (StatusCode::BAD_REQUEST, "journal=I: I is a number\n").into_response(),
    };
    let Some(j) = s.journals.get(journal) else {
        return (StatusCode::NOT_FOUND, format!("no SG journal {journal} here\n")).into_response();
    };
    let broke = match j.break_segment(segment).await {
        Ok(b) => b,
        Err(e) => {
            let why = format!(
                "the break is made but not yet durable in the journal ({e}); it is written again within a second\n"
            );
            return (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
        }
    };
    let broke: Vec<Value> = broke
        .into_iter()
        .map(|(source, kind, gen)| serde_json::json!({ "source": source, "kind": kind, "generation": gen }))
        .collect();
    json(StatusCode::OK, &serde_json::json!({ "journal": journal, "segment": segment, "broken": broke }))
}

async fn drain(State(s): State<Arc<Shared>>) -> Response {
    if s.caches.is_empty() {
        return no_caches();
    }
    let mut drains = tokio::task::JoinSet::new();
    for c in &s.caches {
        let c = c.clone();
        drains
            .spawn(async move { c.cache.drain().await.map_err(|e| format!("target {} LUN {}: {e}", c.target, c.lun)) });
    }
    let mut errors = Vec::new();
    while let Some(done) = drains.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("drain task: {e}")),
        }
    }
    let status = status_json(&s.caches);
    // With one LUN the cache's own message, as before; with several, each names its LUN.
    if errors.is_empty() {
        json(StatusCode::OK, &status)
    } else {
        errors.sort();
        let error = if s.caches.len() == 1 {
            errors.iter().map(|e| e.split_once(": ").map_or(e.as_str(), |(_, m)| m)).collect::<Vec<_>>().join("; ")
        } else {
            errors.join("; ")
        };
        json(StatusCode::SERVICE_UNAVAILABLE, &serde_json::json!({ "error": error, "status": status }))
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "GET /metrics, GET /status, POST /drain or POST /break?segment=N\n").into_response()
}
