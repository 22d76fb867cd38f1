//! Server-sent event streams (docs/events.md):
//! - `GET /v1/streams/events` — every event the caller may see, filtered by `event` (repeated or
//!   comma-separated `<EventType>.v<N>`), `workflow`, `executionId`, `principalId`; any other
//!   query parameter is a 400. Authenticated by a bearer key or a single-use stream `token`.
//! - `GET /v1/executions/{id}/events` with `Accept: text/event-stream` — one execution's events
//!   from its first, ending when the execution comes to rest (see [`open`]).
//! - `POST /v1/streams/token` — a single-use token valid 300 s for clients that cannot set headers,
//!   bound to the key that minted it (revoking the key voids it).
//!
//! An open stream re-checks its holder every [`REAUTHORIZE`]: a revoked or expired key ends it,
//! a revoked workflow grant drops that workflow from it (and ends it when none is left).
//!
//! Framing: `id:` the outbox cursor (assigned in commit order), `event:` `<EventType>.v<N>`,
//! `data:` the OutboxEvent JSON, `: keepalive` comments every 15 s, `retry:` 3 s on the first
//! message. `Last-Event-ID` (or `lastEventId`) resumes after that cursor with no gap and no
//! duplicate; a cursor this server never issued is answered with an explicit `resync` event
//! carrying the current cursor. Filters are narrowed to the caller's entitlements at connect time.

use crate::ApiState;
use crate::auth::{Caller, permissions_of};
use crate::error::ApiError;
use crate::views;
use axum::Json;
use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use capstan_store::streams::StreamFilter;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a stream token lives.
pub const TOKEN_LIFETIME_SECONDS: i64 = 300;
/// How often a stream looks for events committed elsewhere (other nodes) when nothing woke it.
const POLL: Duration = Duration::from_millis(500);
/// Events one read of the outbox returns at most.
const PAGE: i64 = 200;

/// Open SSE connections, bounded in all and per principal; closed all at once when the server
/// shuts down.
#[derive(Debug)]
pub struct StreamCapacity {
    total: Arc<Semaphore>,
    closing: tokio::sync::watch::Sender<bool>,
    per_principal: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl StreamCapacity {
    /// `connections` streams at most, `per_principal` of them for any one principal (so one key
    /// cannot take them all).
    pub fn new(connections: usize, per_principal: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(connections)),
            closing: tokio::sync::watch::Sender::new(false),
            per_principal,
            held: Arc::default(),
        }
    }

    /// Ends every open stream (shutdown).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// A slot for one more stream of `principal`, or 503 when the node's or the principal's
    /// share is taken.
    fn take(&self, principal: &str) -> Result<Slot, ApiError> {
        let exhausted = |message: String| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "stream_capacity_exhausted",
                message,
            )
        };
        let permit = self.total.clone().try_acquire_owned().map_err(|_| {
            exhausted("every stream connection of this node is in use; retry later".to_owned())
        })?;
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(principal.to_owned()).or_default();
        if *count >= self.per_principal {
            return Err(exhausted(format!(
                "this principal already holds {} streams on this node (`stream_connections_per_principal`); close one or retry later",
                self.per_principal
            )));
        }
        *count += 1;
        metrics::gauge!(SSE_CONNECTIONS).increment(1.0);
        Ok(Slot {
            _permit: permit,
            principal: principal.to_owned(),
            held: self.held.clone(),
        })
    }
}

/// One open stream's share of [`StreamCapacity`], given back when the stream ends.
struct Slot {
    _permit: OwnedSemaphorePermit,
    principal: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// Open SSE connections of this node (`/metrics`).
pub const SSE_CONNECTIONS: &str = "capstan_sse_connections";

impl Drop for Slot {
    fn drop(&mut self) {
        metrics::gauge!(SSE_CONNECTIONS).decrement(1.0);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.principal) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.principal);
            }
        }
    }
}

/// Who a stream serves, asked again every [`REAUTHORIZE`] while it is open: a revoked or
/// expired key ends it, a revoked grant narrows its workflows (and ends it when none is left).
#[derive(Debug, Clone)]
struct Holder {
    principal_id: String,
    key_id: Option<String>,
}

impl Holder {
    fn of(caller: &Caller) -> Self {
        Self {
            principal_id: caller.principal_id.clone(),
            key_id: caller.key_id.clone(),
        }
    }

    /// The workflows of `filter` the holder may still see (none when its key is no longer
    /// valid), or `None` when that could not be read now (the stream goes on and asks again).
    async fn still_entitled(&self, state: &ApiState, filter: &StreamFilter) -> Option<Vec<String>> {
        if let Some(key_id) = &self.key_id {
            match state.store.api_key(key_id).await {
                Ok(Some(key)) if key.revoked_ms.is_none() && key.expires_ms > state.now() => {}
                Ok(_) => return Some(Vec::new()),
                Err(error) => {
                    tracing::warn!(%error, "stream could not re-check its key; asking again later");
                    return None;
                }
            }
        }
        let permissions = permissions_of(state, &self.principal_id).await.ok()?;
        Some(
            filter
                .workflows
                .iter()
                .filter(|w| permissions.contains(&format!("workflows:{w}")))
                .cloned()
                .collect(),
        )
    }
}

/// How often an open stream re-checks its holder's key and grants.
const REAUTHORIZE: Duration = Duration::from_secs(2);

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/streams/events", get(stream_events))
        .route("/v1/streams/token", post(mint_token))
        .with_state(state)
}

fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The caller's workflow entitlements, or 403 when there are none.
async fn require_workflows(
    state: &ApiState,
    caller: &Caller,
    resource: &str,
) -> Result<Vec<String>, ApiError> {
    let workflows = caller.workflows();
    caller
        .audit(state, "workflows:*", resource, None, !workflows.is_empty())
        .await?;
    if workflows.is_empty() {
        return Err(ApiError::forbidden("workflows:<name> (any workflow)"));
    }
    Ok(workflows)
}

/// `POST /v1/streams/token`.
async fn mint_token(
    State(state): State<ApiState>,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_workflows(&state, &caller, "/v1/streams/token").await?;
    let token = format!(
        "cst_{}",
        hex::encode(capstan_core::secrets::random_bytes::<32>())
    );
    let now = state.now();
    state
        .store
        .insert_stream_token(
            &token_hash(&token),
            &caller.principal_id,
            caller.key_id.as_deref(),
            now,
            now + TOKEN_LIFETIME_SECONDS * 1000,
        )
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(
        json!({"expiresIn": TOKEN_LIFETIME_SECONDS, "token": token}),
    ))
}

fn invalid_filter(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_filter", message)
}

/// `GET /v1/streams/events`.
async fn stream_events(
    State(state): State<ApiState>,
    request: Request,
) -> Result<Response, ApiError> {
    let (mut parts, _) = request.into_parts();
    let axum::extract::Query(query) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map_err(|e| invalid_filter(e.body_text()))?;
    let mut filter = StreamFilter::default();
    let mut wanted_workflows = Vec::new();
    let mut token = None;
    let mut cursor = None;
    for (key, value) in &query {
        match key.as_str() {
            "event" => {
                for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    // `<EventType>.v<N>` is that version; a bare `<EventType>` every catalogued
                    // version of it.
                    let versions: Vec<(String, String)> =
                        match capstan_engine::catalog::parse_name(name) {
                            Some((ty, version)) => capstan_engine::catalog::find(ty, version)
                                .map(|e| (e.event_type.to_owned(), e.version.to_owned()))
                                .into_iter()
                                .collect(),
                            None => capstan_engine::catalog::catalog()
                                .into_iter()
                                .filter(|e| e.event_type == name)
                                .map(|e| (e.event_type.to_owned(), e.version.to_owned()))
                                .collect(),
                        };
                    if versions.is_empty() {
                        return Err(invalid_filter(format!(
                            "`{name}` is not in the event catalog (an event type, or <EventType>.v<N>; GET /v1/events/catalog)"
                        )));
                    }
                    filter.events.extend(versions);
                }
            }
            "workflow" => wanted_workflows.extend(value.split(',').map(|w| w.trim().to_owned())),
            "executionId" => filter.execution_id = Some(value.clone()),
            "principalId" => filter.principal_id = Some(value.clone()),
            "token" => token = Some(value.clone()),
            "lastEventId" => cursor = Some(value.clone()),
            other => {
                return Err(invalid_filter(format!(
                    "`{other}` is not a stream filter (event, workflow, executionId, principalId, lastEventId, token)"
                )));
            }
        }
    }
    // The token is read here and used only once the stream can open: a refusal for capacity
    // (503) leaves it valid for the retry.
    let caller = match &token {
        Some(token) => {
            let minted = state
                .store
                .peek_stream_token(&token_hash(token), state.now())
                .await
                .map_err(ApiError::internal)?;
            let Some((principal, key_id)) = minted else {
                let anonymous =
                    Caller::for_principal(&parts, "anonymous".to_owned(), Default::default());
                anonymous.audit_failure(&state, "stream-token", "/v1/streams/events");
                return Err(ApiError::unauthorized());
            };
            // The minting principal's permissions as they are now, not as they were.
            let permissions = permissions_of(&state, &principal).await?;
            let mut caller = Caller::for_principal(&parts, principal, permissions);
            caller.key_id = key_id;
            caller
        }
        None => Caller::from_request_parts(&mut parts, &state).await?,
    };
    let entitled = require_workflows(&state, &caller, "/v1/streams/events").await?;
    filter.workflows = if wanted_workflows.is_empty() {
        entitled
    } else {
        wanted_workflows
            .into_iter()
            .filter(|w| entitled.contains(w))
            .collect()
    };
    let cursor = cursor.or_else(|| {
        parts
            .headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let holder = Holder::of(&caller);
    let slot = state.streams.take(&holder.principal_id)?;
    if let Some(token) = &token {
        let used = state
            .store
            .consume_stream_token(&token_hash(token), state.now())
            .await
            .map_err(ApiError::internal)?;
        if used.is_none() {
            // Used by a concurrent request in between.
            return Err(ApiError::unauthorized());
        }
    }
    open(state, holder, filter, cursor, false, slot).await
}

/// `GET /v1/executions/{id}/events` as a stream, for a caller already authorized on `execution_id`.
pub async fn execution_stream(
    state: ApiState,
    caller: &Caller,
    workflow: String,
    execution_id: String,
    last_event_id: Option<String>,
) -> Result<Response, ApiError> {
    let filter = StreamFilter {
        workflows: vec![workflow],
        execution_id: Some(execution_id),
        ..StreamFilter::default()
    };
    let holder = Holder::of(caller);
    let slot = state.streams.take(&holder.principal_id)?;
    open(state, holder, filter, last_event_id, true, slot).await
}

struct Cursor {
    state: ApiState,
    filter: StreamFilter,
    after: i64,
    pending: VecDeque<Event>,
    wake: capstan_store::Wake,
    closing: tokio::sync::watch::Receiver<bool>,
    first: bool,
    /// The last read found every event committed before it: wait for a commit before the next.
    caught_up: bool,
    /// One execution's feed: it ends once it has sent the event that brought the execution to
    /// a terminal status and found nothing after it.
    ends_at_rest: bool,
    /// The last event sent (on a resumed feed, the client's last) is such an event.
    at_rest: bool,
    holder: Holder,
    reauthorize_at: tokio::time::Instant,
    _slot: Slot,
}

impl Cursor {
    /// Queues a page of events to send, in order.
    fn queue(&mut self, events: Vec<capstan_core::store::OutboxRecord>) {
        for e in events {
            self.at_rest = comes_to_rest(&e);
            let id = e.seq.to_string();
            let name = format!("{}.v{}", e.event_type, e.event_version);
            let data = serde_json::to_string(&views::OutboxEvent::from(e)).unwrap_or_default();
            self.pending
                .push_back(Event::default().id(id).event(name).data(data));
        }
    }
}

/// Whether the execution came to rest with `event` ([`capstan_core::transitions::comes_to_rest`]);
/// the payload's `status` is read only for an event that needs it.
fn comes_to_rest(event: &capstan_core::store::OutboxRecord) -> bool {
    #[derive(serde::Deserialize)]
    struct Status {
        status: capstan_core::execution::ExecutionStatus,
    }
    capstan_core::transitions::comes_to_rest(&event.event_type, || {
        serde_json::from_str::<Status>(event.payload_json.as_str())
            .ok()
            .map(|p| p.status)
    })
}

/// A stream of the outbox after `cursor` (from the first event when `from_start`, else from
/// now). `from_start` is one execution's feed (its `filter` names it), which ends when the
/// execution comes to rest: after the event that brings it to a terminal status, once a read
/// finds nothing after that event. A client that resumes such a feed at that event is
/// answered 204 No Content, which tells an `EventSource` to stop reconnecting.
async fn open(
    state: ApiState,
    holder: Holder,
    filter: StreamFilter,
    cursor: Option<String>,
    from_start: bool,
    slot: Slot,
) -> Result<Response, ApiError> {
    let cursor = cursor.as_deref().map(str::trim).filter(|c| !c.is_empty());
    // The newest cursor is read only when it is needed: to check the client's cursor or to
    // start at the end. A feed from its first event (the common one-execution feed) needs neither.
    let last = if from_start && cursor.is_none() {
        0
    } else {
        state
            .store
            .last_event_seq()
            .await
            .map_err(ApiError::internal)?
    };
    let mut pending = VecDeque::new();
    let mut resumed = None;
    let after = match cursor {
        None => {
            if from_start {
                0
            } else {
                last
            }
        }
        Some(text) => match text.parse::<i64>() {
            Ok(n) if (0..=last).contains(&n) => {
                resumed = Some(n).filter(|&n| n > 0);
                n
            }
            _ => {
                pending.push_back(
                    Event::default()
                        .event("resync")
                        .data(json!({"reason": "unknown_cursor", "lastEventId": text, "resumeFrom": last.to_string()}).to_string()),
                );
                if from_start { 0 } else { last }
            }
        },
    };
    // One execution's feed wakes for that execution's commits only.
    let wake = state.store.wake_for(filter.execution_id.as_deref());
    let state_closing = state.streams.closing.subscribe();
    let mut cursor = Cursor {
        state,
        filter,
        after,
        pending,
        wake,
        closing: state_closing,
        first: true,
        caught_up: false,
        ends_at_rest: from_start,
        at_rest: false,
        holder,
        reauthorize_at: tokio::time::Instant::now() + REAUTHORIZE,
        _slot: slot,
    };
    if let Some(n) = resumed
        && from_start
    {
        // The first read includes the client's last event, to learn whether the execution
        // came to rest with it.
        cursor.wake.mark_seen();
        let mut page = cursor
            .state
            .store
            .events_after(n - 1, &cursor.filter, PAGE)
            .await
            .map_err(ApiError::internal)?;
        cursor.caught_up = page.caught_up;
        if page.events.first().is_some_and(|e| e.seq == n) {
            let seen = page.events.remove(0);
            cursor.at_rest = comes_to_rest(&seen);
        }
        cursor.after = page.cursor.max(n);
        if page.events.is_empty() && cursor.caught_up && cursor.at_rest {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        cursor.queue(page.events);
    }
    let stream = futures_util::stream::unfold(cursor, |mut c| async move {
        loop {
            if *c.closing.borrow() {
                return None;
            }
            if tokio::time::Instant::now() >= c.reauthorize_at {
                c.reauthorize_at = tokio::time::Instant::now() + REAUTHORIZE;
                if let Some(workflows) = c.holder.still_entitled(&c.state, &c.filter).await {
                    if workflows.is_empty() {
                        return None;
                    }
                    c.filter.workflows = workflows;
                }
            }
            if let Some(mut event) = c.pending.pop_front() {
                if c.first {
                    event = event.retry(Duration::from_secs(3));
                    c.first = false;
                }
                return Some((Ok::<Event, std::convert::Infallible>(event), c));
            }
            if c.caught_up {
                if c.ends_at_rest && c.at_rest {
                    return None;
                }
                c.caught_up = false;
                tokio::select! {
                    // A closed channel disables its branch; a gone closer means closing.
                    () = c.wake.changed() => {}
                    _ = c.closing.wait_for(|s| *s) => return None,
                    () = tokio::time::sleep(POLL) => {}
                }
                continue;
            }
            c.wake.mark_seen();
            match c.state.store.events_after(c.after, &c.filter, PAGE).await {
                Ok(page) => {
                    c.after = page.cursor;
                    // A page that read every event committed before it lets the next read wait
                    // for a commit after `mark_seen` (or the poll), rather than reading at once
                    // what it would find unchanged.
                    c.caught_up = page.caught_up;
                    if !page.caught_up && page.events.is_empty() {
                        // A stream far behind reads on in bounded steps (on SQLite, on this
                        // worker thread); it gives the others their turn between them.
                        tokio::task::yield_now().await;
                    }
                    c.queue(page.events);
                }
                Err(error) => {
                    tracing::warn!(%error, "stream could not read the outbox; retrying");
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    });
    Ok(Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(15))
                .text("keepalive"),
        )
        .into_response())
}
