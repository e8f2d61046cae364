//! The double's HTTP side: routes kube-rs requests to the store and streams
//! watches as newline-delimited JSON events.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::selector::{Selector, fields, labels};
use super::store::{Change, EventType, Part, Refusal, Resource, Store, merge_patch};

/// What a request asked for, for the per-path request counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    List,
    Watch,
    Get,
    Create,
    Replace,
    Patch,
    Delete,
}

/// State shared by the handle and every connection.
pub struct Shared {
    pub store: Mutex<Store>,
    pub resources: Vec<Resource>,
    pub requests: Mutex<HashMap<(Verb, String), usize>>,
    /// Bumped to end every open watch at once.
    pub cut: watch::Sender<u64>,
    /// Bumped each time watches are made silent: a watch open then stays
    /// silent even if `silent` is cleared before it next runs.
    pub silenced: watch::Sender<u64>,
    /// While set, open watches go silent for good: connection open,
    /// nothing sent.
    pub silent: AtomicBool,
    pub bookmark_interval: Mutex<Duration>,
    pub open_watches: Mutex<usize>,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

pub async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(refusal(&Refusal::new(400, "BadRequest", "unreadable body"))),
    };
    let query = parse_query(parts.uri.query().unwrap_or_default());
    let Some(route) = Route::parse(&shared.resources, parts.uri.path()) else {
        return Ok(refusal(&Refusal::new(
            404,
            "NotFound",
            format!(
                "the server could not find the requested resource ({})",
                parts.uri.path()
            ),
        )));
    };
    let verb = match (&parts.method, &route.name) {
        (&Method::GET, None) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            Verb::Watch
        }
        (&Method::GET, None) => Verb::List,
        (&Method::GET, Some(_)) => Verb::Get,
        (&Method::POST, None) => Verb::Create,
        (&Method::PUT, Some(_)) => Verb::Replace,
        (&Method::PATCH, Some(_)) => Verb::Patch,
        (&Method::DELETE, Some(_)) => Verb::Delete,
        _ => {
            return Ok(refusal(&Refusal::new(
                405,
                "MethodNotAllowed",
                "method not allowed on this path",
            )));
        }
    };
    *shared
        .requests
        .lock()
        .entry((verb, parts.uri.path().to_owned()))
        .or_default() += 1;

    let selector = |name: &str| Selector::parse(query.get(name).map_or("", String::as_str));
    let (label_selector, field_selector) =
        match (selector("labelSelector"), selector("fieldSelector")) {
            (Ok(labels), Ok(fields)) => (labels, fields),
            (Err(e), _) | (_, Err(e)) => {
                return Ok(refusal(&Refusal::new(400, "BadRequest", e)));
            }
        };
    let filter = Filter {
        resource: route.resource.clone(),
        namespace: route.namespace.clone(),
        labels: label_selector,
        fields: field_selector,
    };
    let name = route.name.clone().unwrap_or_default();
    let part = if route.status {
        Part::Status
    } else {
        Part::Main
    };
    if route.scale {
        let mut store = shared.store.lock();
        let result = match verb {
            Verb::Get => store.scale(&route.resource, &route.namespace, &name),
            Verb::Replace => parse_body(&body).and_then(|scale| {
                store.set_scale(&route.resource, &route.namespace, &name, &scale)
            }),
            _ => Err(Refusal::new(
                405,
                "MethodNotAllowed",
                "the double reads and replaces /scale only",
            )),
        };
        return Ok(match result {
            Ok(scale) => json_response(StatusCode::OK, &scale),
            Err(r) => refusal(&r),
        });
    }
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();

    let result = match verb {
        Verb::Watch => return Ok(start_watch(&shared, filter, &query)),
        Verb::List => Ok((StatusCode::OK, list(&shared.store.lock(), &filter))),
        Verb::Get => shared
            .store
            .lock()
            .get(&route.resource, &route.namespace, &name)
            .cloned()
            .map(|o| (StatusCode::OK, o))
            .ok_or_else(|| Refusal::not_found(&route.resource, &name)),
        Verb::Create => parse_body(&body).and_then(|o| {
            shared
                .store
                .lock()
                .create(&route.resource, &route.namespace, o)
                .map(|o| (StatusCode::CREATED, o))
        }),
        Verb::Replace => parse_body(&body).and_then(|o| {
            shared
                .store
                .lock()
                .replace(&route.resource, &route.namespace, &name, o, part)
                .map(|o| (StatusCode::OK, o))
        }),
        Verb::Patch => parse_body(&body).and_then(|patch| {
            apply_patch(
                &mut shared.store.lock(),
                &route,
                &name,
                part,
                &content_type,
                patch,
            )
        }),
        Verb::Delete => shared
            .store
            .lock()
            .delete(&route.resource, &route.namespace, &name)
            .map(|o| (StatusCode::OK, o)),
    };
    Ok(match result {
        Ok((status, object)) => json_response(status, &object),
        Err(r) => refusal(&r),
    })
}

/// Merge patch, strategic merge patch (merged the same way: the kinds the
/// gateway patches have no lists merged by key) and server-side apply
/// (the applied object merged in, created when absent), as kube-rs sends
/// them.
fn apply_patch(
    store: &mut Store,
    route: &Route,
    name: &str,
    part: Part,
    content_type: &str,
    patch: Value,
) -> Result<(StatusCode, Value), Refusal> {
    let apply = content_type.starts_with("application/apply-patch");
    let merge = content_type.starts_with("application/merge-patch+json")
        || content_type.starts_with("application/strategic-merge-patch+json");
    if !apply && !merge {
        return Err(Refusal::new(
            415,
            "UnsupportedMediaType",
            format!("the double does not take {content_type:?} patches"),
        ));
    }
    if let Some(named) = patch.pointer("/metadata/name").and_then(Value::as_str)
        && named != name
    {
        return Err(Refusal::new(
            400,
            "BadRequest",
            format!("the name of the object ({named}) does not match the name on the URL ({name})"),
        ));
    }
    let current = store.get(&route.resource, &route.namespace, name).cloned();
    match current {
        None if apply && part == Part::Main => {
            let mut object = patch;
            if object.pointer("/metadata/name").is_none() {
                merge_patch(&mut object, &json!({"metadata": {"name": name}}));
            }
            store
                .create(&route.resource, &route.namespace, object)
                .map(|o| (StatusCode::CREATED, o))
        }
        None => Err(Refusal::not_found(&route.resource, name)),
        Some(mut object) => {
            if apply {
                // Apply carries apiVersion/kind; they are not changes.
                let mut patch = patch;
                if let Some(map) = patch.as_object_mut() {
                    map.remove("apiVersion");
                    map.remove("kind");
                }
                merge_patch(&mut object, &patch);
            } else {
                merge_patch(&mut object, &patch);
            }
            store
                .replace(&route.resource, &route.namespace, name, object, part)
                .map(|o| (StatusCode::OK, o))
        }
    }
}

fn parse_body(body: &Bytes) -> Result<Value, Refusal> {
    serde_json::from_slice(body)
        .map_err(|e| Refusal::new(400, "BadRequest", format!("body is not JSON: {e}")))
}

/// The objects of one kind in one namespace that a watch or list selects.
#[derive(Debug, Clone)]
struct Filter {
    resource: Resource,
    namespace: String,
    labels: Selector,
    fields: Selector,
}

impl Filter {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches(&labels(object)) && self.fields.matches(&fields(object))
    }

    /// The event a change makes for this filter: an object leaving the
    /// selection is DELETED, one entering it ADDED.
    fn event_for(&self, change: &Change) -> Option<&'static str> {
        if change.resource != self.resource || change.namespace != self.namespace {
            return None;
        }
        let now = self.selects(&change.object);
        match change.kind {
            EventType::Modified => {
                let before = change.previous.as_ref().is_some_and(|p| self.selects(p));
                match (before, now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
            kind => now.then_some(kind.as_str()),
        }
    }
}

fn list(store: &Store, filter: &Filter) -> Value {
    let items: Vec<Value> = store
        .list(&filter.resource, &filter.namespace)
        .filter(|o| filter.selects(o))
        .cloned()
        .collect();
    json!({
        "apiVersion": filter.resource.api_version(),
        "kind": format!("{}List", filter.resource.kind),
        "metadata": {"resourceVersion": store.revision.to_string()},
        "items": items,
    })
}

fn expired(resource_version: &str) -> Value {
    json!({
        "type": "ERROR",
        "object": Refusal::new(410, "Expired", format!("too old resource version: {resource_version}")).to_status(),
    })
}

fn event_line(event: &Value) -> Bytes {
    let mut line = serde_json::to_vec(event).expect("JSON values serialize");
    line.push(b'\n');
    Bytes::from(line)
}

/// Open a watch: the events after the requested resourceVersion still in
/// history (or the current objects as ADDED when none was asked for), then
/// changes as they happen, bookmarks when allowed, until the client goes,
/// `timeoutSeconds` pass, or a test cuts it.
fn start_watch(
    shared: &Arc<Shared>,
    filter: Filter,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let requested = query.get("resourceVersion").cloned().unwrap_or_default();

    let mut backlog = Vec::new();
    let (feed, seen) = {
        let store = shared.store.lock();
        let feed = store.feed.subscribe();
        match requested.parse::<u64>() {
            Ok(from) if from > 0 => match store.changes_since(from) {
                Some(changes) => {
                    for change in changes {
                        if let Some(kind) = filter.event_for(change) {
                            backlog.push(json!({"type": kind, "object": change.object}));
                        }
                    }
                }
                None => backlog.push(expired(&requested)),
            },
            _ => {
                for object in store.list(&filter.resource, &filter.namespace) {
                    if filter.selects(object) {
                        backlog.push(json!({"type": "ADDED", "object": object}));
                    }
                }
            }
        }
        (feed, store.revision)
    };
    let ended = backlog.first().is_some_and(|e| e["type"] == "ERROR");
    let lines: Vec<Bytes> = backlog.iter().map(event_line).collect();
    let shared = shared.clone();
    tokio::spawn(async move {
        *shared.open_watches.lock() += 1;
        stream_watch(
            &shared, filter, lines, ended, feed, seen, bookmarks, timeout, tx,
        )
        .await;
        *shared.open_watches.lock() -= 1;
    });
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<_, Infallible>(Frame::data(line)), rx))
    }));
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(UnsyncBoxBody::new(body))
        .expect("static response parts")
}

#[allow(clippy::too_many_arguments)]
async fn stream_watch(
    shared: &Shared,
    filter: Filter,
    backlog: Vec<Bytes>,
    ended: bool,
    mut feed: broadcast::Receiver<Change>,
    mut seen: u64,
    bookmarks: bool,
    timeout: Duration,
    tx: mpsc::Sender<Bytes>,
) {
    let mut cut = shared.cut.subscribe();
    cut.mark_unchanged();
    let mut silenced = shared.silenced.subscribe();
    silenced.mark_unchanged();
    for line in backlog {
        if tx.send(line).await.is_err() {
            return;
        }
    }
    if ended {
        return;
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut silent = false;
    let interval = *shared.bookmark_interval.lock();
    let mut bookmark = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        silent |= shared.silent.load(Ordering::SeqCst) || silenced.has_changed().unwrap_or(false);
        // Biased: what a test did before this task ran (cut it, silenced
        // it) comes before the changes it made since.
        tokio::select! {
            biased;
            _ = cut.changed() => return,
            _ = silenced.changed(), if !silent => {
                silent = true;
                continue;
            }
            _ = &mut deadline => return,
            _ = tx.closed() => return,
            received = feed.recv(), if !silent => match received {
                Ok(change) => {
                    if change.resource_version <= seen {
                        continue;
                    }
                    seen = change.resource_version;
                    if shared.silent.load(Ordering::SeqCst) {
                        silent = true;
                        continue;
                    }
                    if let Some(kind) = filter.event_for(&change)
                        && tx.send(event_line(&json!({"type": kind, "object": change.object}))).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = tx.send(event_line(&expired(&seen.to_string()))).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = bookmark.tick(), if bookmarks && !silent => {
                if shared.silent.load(Ordering::SeqCst) {
                    silent = true;
                    continue;
                }
                // Every change sent before this point has been seen, so the
                // bookmark's version is one the client may resume from.
                let mut pending = Vec::new();
                while let Ok(change) = feed.try_recv() {
                    pending.push(change);
                }
                for change in pending {
                    if change.resource_version <= seen {
                        continue;
                    }
                    seen = change.resource_version;
                    if let Some(kind) = filter.event_for(&change)
                        && tx.send(event_line(&json!({"type": kind, "object": change.object}))).await.is_err()
                    {
                        return;
                    }
                }
                let mark = json!({
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": filter.resource.api_version(),
                        "kind": filter.resource.kind,
                        "metadata": {"resourceVersion": seen.to_string()},
                    },
                });
                if tx.send(event_line(&mark)).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(UnsyncBoxBody::new(Full::new(Bytes::from(
            serde_json::to_vec(value).expect("JSON values serialize"),
        ))))
        .expect("static response parts")
}

fn refusal(refusal: &Refusal) -> Response<Body> {
    let status = StatusCode::from_u16(refusal.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &refusal.to_status())
}

fn parse_query(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// A request path: a namespaced collection, one object, or its status.
#[derive(Debug)]
struct Route {
    resource: Resource,
    namespace: String,
    name: Option<String>,
    status: bool,
    /// The `/scale` subresource.
    scale: bool,
}

impl Route {
    fn parse(resources: &[Resource], path: &str) -> Option<Route> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let ["namespaces", namespace, plural, tail @ ..] = rest else {
            return None;
        };
        let resource = resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == *plural)?
            .clone();
        let (name, status, scale) = match tail {
            [] => (None, false, false),
            [name] => (Some(name.to_string()), false, false),
            [name, "status"] if resource.status_subresource => {
                (Some(name.to_string()), true, false)
            }
            [name, "scale"] if resource.scale_subresource => (Some(name.to_string()), false, true),
            _ => return None,
        };
        Some(Route {
            resource,
            namespace: namespace.to_string(),
            name,
            status,
            scale,
        })
    }
}
