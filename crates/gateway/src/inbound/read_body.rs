//! Reading a request body whole, within two bounds: its own size
//! (`limits.maxBodyBytes`) and the bytes of every body held at once
//! (`limits.maxBufferedBodyBytes`), so that many large uploads together
//! cannot exhaust the gateway's memory. A body is read once, into a buffer
//! sized from its declared length when it has one, and its share of the
//! budget is held until the request is done with it.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Time a request has to arrive in full once its head has: a client
/// sending a byte now and then must not hold its budget forever.
pub const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of request body the gateway may hold at once.
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    limit: u64,
    wait: Duration,
}

/// A body's share of the budget, given back when dropped.
pub struct Held(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl Held {
    /// Nothing held yet: a body that arrives in parts takes its share as
    /// they come.
    pub fn none() -> Self {
        Self(None)
    }
}

impl BodyBudget {
    pub fn new(limit: u64, wait: Duration) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS as u64);
        Self {
            bytes: Arc::new(Semaphore::new(limit as usize)),
            limit,
            wait,
        }
    }

    /// Bytes held now, for metrics.
    pub fn held(&self) -> u64 {
        self.limit - self.bytes.available_permits() as u64
    }

    /// `n` more bytes, waiting up to the budget's wait for them.
    pub async fn take(&self, n: u64, held: &mut Held) -> Result<(), ApiError> {
        if n == 0 {
            return Ok(());
        }
        // `n` is at most `limits.maxBodyBytes`, which validation keeps
        // within the budget; u32 bounds one acquisition.
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let acquired =
            tokio::time::timeout(self.wait, Arc::clone(&self.bytes).acquire_many_owned(n)).await;
        match acquired {
            Ok(Ok(permit)) => {
                match &mut held.0 {
                    Some(p) => p.merge(permit),
                    None => held.0 = Some(permit),
                }
                Ok(())
            }
            _ => Err(ApiError::body_budget_exhausted(Duration::from_secs(1))),
        }
    }
}

/// The whole body of a request with `headers`, at most `limit` bytes.
pub async fn read(
    body: Incoming,
    headers: &HeaderMap,
    limit: u64,
    budget: &BodyBudget,
) -> Result<(Bytes, Held), ApiError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|len| len > limit) {
        // Refused unread; hyper sends no 100 Continue for a body nobody
        // asked for.
        return Err(ApiError::body_too_large(limit));
    }
    let mut held = Held(None);
    budget.take(declared.unwrap_or(0), &mut held).await?;
    match tokio::time::timeout(
        ARRIVAL_TIMEOUT,
        collect(body, declared, limit, budget, &mut held),
    )
    .await
    {
        Ok(read) => read.map(|bytes| (bytes, held)),
        Err(_) => Err(ApiError::request_timeout(ARRIVAL_TIMEOUT)),
    }
}

async fn collect(
    mut body: Incoming,
    declared: Option<u64>,
    limit: u64,
    budget: &BodyBudget,
    held: &mut Held,
) -> Result<Bytes, ApiError> {
    // hyper has checked that the body matches its declared length.
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::invalid_request(format!("Could not read the request body: {e}"))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() as u64 + data.len() as u64 > limit {
            return Err(ApiError::body_too_large(limit));
        }
        if declared.is_none() {
            budget.take(data.len() as u64, held).await?;
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// The length a body declares, once hyper has framed it: one valid
/// `Content-Length` (hyper refuses conflicting ones).
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}
