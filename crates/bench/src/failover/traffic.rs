//! Steady seeded streaming traffic through the router: open-loop Poisson
//! arrivals, one streamed chat completion each, recording when it was
//! sent, which member answered (`x-infergate-member`), its time to first
//! token and how it ended.

use std::time::Duration;

use futures_util::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::time::Instant;

use super::members::MODEL;

/// One request's record, times from the start of the traffic.
#[derive(Debug, Clone)]
pub struct Answer {
    pub sent: Duration,
    /// The member the router passed the answer on from.
    pub member: Option<String>,
    /// To the first SSE data event.
    pub ttft: Option<Duration>,
    /// `Err` names the cause: the status and error code, a cut stream, a
    /// connection failure.
    pub result: Result<(), String>,
}

/// The planned requests: arrival offsets and bodies, from `seed`.
pub fn plan(seed: u64, rate: f64, length: Duration) -> Vec<(Duration, serde_json::Value)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut at = 0.0;
    let mut planned = Vec::new();
    loop {
        // Exponential gaps: a Poisson stream at `rate` per second.
        let u: f64 = rng.r#gen::<f64>().max(f64::MIN_POSITIVE);
        at += -u.ln() / rate;
        if at >= length.as_secs_f64() {
            return planned;
        }
        let words = rng.gen_range(20..200);
        let prompt: Vec<String> = (0..words)
            .map(|_| format!("w{}", rng.gen_range(0..5000)))
            .collect();
        let body = json!({
            "model": MODEL,
            "stream": true,
            "max_tokens": rng.gen_range(16..64),
            "messages": [{"role": "user", "content": prompt.join(" ")}],
        });
        planned.push((Duration::from_secs_f64(at), body));
    }
}

/// Send every planned request at its time to the router at `url`;
/// return the records in plan order. `start` is time zero.
pub async fn run(
    url: String,
    start: Instant,
    planned: Vec<(Duration, serde_json::Value)>,
    timeout: Duration,
) -> anyhow::Result<Vec<Answer>> {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .http1_only()
        .pool_max_idle_per_host(usize::MAX)
        .build()?;
    let mut tasks = Vec::with_capacity(planned.len());
    for (at, body) in planned {
        tokio::time::sleep_until(start + at).await;
        let (client, url) = (client.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let due = start + at;
            let mut answer = Answer {
                sent: at,
                member: None,
                ttft: None,
                result: Err("timed out".to_owned()),
            };
            let exchange = one(&client, &url, body, due, &mut answer);
            if let Ok(result) = tokio::time::timeout(timeout, exchange).await {
                answer.result = result;
            }
            answer
        }));
    }
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await?);
    }
    Ok(answers)
}

async fn one(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
    due: Instant,
    answer: &mut Answer,
) -> Result<(), String> {
    let response = client
        .post(url)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("no answer: {}", short_error(&e)))?;
    answer.member = response
        .headers()
        .get("x-infergate-member")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = response.status();
    if !status.is_success() {
        let error: serde_json::Value = response.json().await.unwrap_or_default();
        let code = error["error"]["code"].as_str().unwrap_or("-");
        return Err(format!("{} {code}", status.as_u16()));
    }
    let mut stream = response.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| "stream cut".to_owned())?;
        if answer.ttft.is_none() && chunk.windows(5).any(|w| w == b"data:") {
            answer.ttft = Some(due.elapsed());
        }
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8_lossy(&text);
    if text.contains("\"error\"") {
        Err("error event in stream".to_owned())
    } else if !text.contains("data: [DONE]") {
        Err("stream ended early".to_owned())
    } else {
        Ok(())
    }
}

fn short_error(e: &reqwest::Error) -> &'static str {
    if e.is_connect() {
        "connection refused"
    } else if e.is_timeout() {
        "timeout"
    } else {
        "connection failed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_seeded_and_near_its_rate() {
        let a = plan(7, 40.0, Duration::from_secs(30));
        let b = plan(7, 40.0, Duration::from_secs(30));
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x == y));
        assert!((1000..1400).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_ne!(plan(8, 40.0, Duration::from_secs(30))[0], a[0]);
    }
}
