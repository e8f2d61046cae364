//! Waking a cold pool through its webhook: POST `{"pool": NAME}`, once
//! per cold start, retried a bounded number of times.

use std::sync::Arc;
use std::time::Duration;

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait before the first retry; it doubles each time.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

pub async fn call_webhook(pool: Arc<str>, url: Arc<str>) {
    let client = reqwest::Client::builder()
        .timeout(CALL_TIMEOUT)
        .build()
        .unwrap_or_default();
    let body = serde_json::json!({ "pool": &*pool });
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=config::defaults::WAKE_WEBHOOK_ATTEMPTS {
        match client.post(&*url).json(&body).send().await {
            Ok(resp) if resp.status().is_success() => {
                tracing::info!(pool = %pool, url = %url, "asked the pool's wake webhook for a replica");
                return;
            }
            Ok(resp) => tracing::warn!(pool = %pool, url = %url, status = %resp.status(), attempt,
                "the pool's wake webhook refused"),
            Err(e) => tracing::warn!(pool = %pool, url = %url, error = %e, attempt,
                "the pool's wake webhook failed"),
        }
        tokio::time::sleep(backoff).await;
        backoff *= 2;
    }
}
