//! Rate limits end to end: refusals in OpenAI's shape with its headers,
//! reservations settled to the usage replicas report, and one limit held
//! by two gateways that share a real Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gateway::Gateway;
use http::StatusCode;
use serde_json::{Value, json};

use crate::support::redis::RedisServer;
use crate::support::{Behaviour, CHAT, FakeReplica, client, closed_port, config, plain_pool};

/// A replica that reports 20 prompt and 80 completion tokens every time.
async fn counting_replica() -> FakeReplica {
    let body = json!({
        "id": "c", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 80, "total_tokens": 100},
    });
    FakeReplica::start("a", Behaviour::Reply(StatusCode::OK, body.to_string())).await
}

async fn chat(gw: &Gateway, max_tokens: u64) -> reqwest::Response {
    client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .json(&json!({"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> u64 {
    r.headers()[name].to_str().unwrap().parse().unwrap()
}

/// The limits of both backends, so each test holds them to one behaviour.
enum Backend {
    Local,
    Redis(RedisServer),
}

impl Backend {
    fn spec(&self, global: &str) -> String {
        match self {
            Backend::Local => format!("  rateLimits: {{global: {global}}}\n"),
            Backend::Redis(r) => format!(
                "  rateLimits: {{backend: redis, redis: {{url: \"{}\", timeout: 2s}}, global: {global}}}\n",
                r.url
            ),
        }
    }
}

async fn over_the_request_limit(backend: Backend) {
    let replica = counting_replica().await;
    let pools = plain_pool(&[&replica.addr.to_string()], "");
    let gw = Gateway::start(&config(&backend.spec("{requestsPerMinute: 2}"), &pools))
        .await
        .unwrap();
    for remaining in [1, 0] {
        let r = chat(&gw, 10).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit-requests"), 2);
        assert_eq!(header(&r, "x-ratelimit-remaining-requests"), remaining);
        let reset = r.headers()["x-ratelimit-reset-requests"].to_str().unwrap();
        assert!(reset.ends_with('s'), "{reset}");
    }
    let r = chat(&gw, 10).await;
    assert_eq!(r.status(), 429);
    // Half a minute until one more request fits: 2 per minute refill one
    // every 30 s.
    let after = header(&r, "retry-after");
    assert!((29..=30).contains(&after), "{after}");
    let after_ms = header(&r, "retry-after-ms");
    assert!((28_000..=30_000).contains(&after_ms), "{after_ms}");
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), 0);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "requests");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Rate limit reached for m on requests per min (RPM) for all callers: Limit 2, Used 2, Requested 1. Please try again in 2"),
        "{message}"
    );
    assert_eq!(
        replica.count(),
        2,
        "the refused request never reached the replica"
    );
}

#[tokio::test]
async fn over_the_request_limit_is_a_429_in_openai_shape_local() {
    over_the_request_limit(Backend::Local).await;
}

#[tokio::test]
async fn over_the_request_limit_is_a_429_in_openai_shape_redis() {
    over_the_request_limit(Backend::Redis(RedisServer::start().await)).await;
}

async fn settled_to_usage(backend: Backend) {
    let replica = counting_replica().await;
    let pools = plain_pool(&[&replica.addr.to_string()], "");
    let gw = Gateway::start(&config(&backend.spec("{tokensPerDay: 100000}"), &pools))
        .await
        .unwrap();
    // "hi" is a token of prompt; 1000 reserved for the answer.
    let first = chat(&gw, 1000).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), 100_000);
    // 1000 for the answer and a token or two of prompt estimate.
    let remaining = header(&first, "x-ratelimit-remaining-tokens");
    assert!((98_990..=99_000).contains(&remaining), "{remaining}");
    drop(first.bytes().await.unwrap());
    // Settled to the 100 tokens used: 900 come back. Probed with a request
    // larger than the whole limit, which is refused without a charge and
    // carries the remaining count.
    let remaining =
        crate::support::poll_until(Duration::from_secs(10), "the settlement", || async {
            let r = chat(&gw, 200_000).await;
            assert_eq!(r.status(), 429);
            let remaining = header(&r, "x-ratelimit-remaining-tokens");
            if remaining > 99_000 {
                Ok(remaining)
            } else {
                Err(format!("{remaining} tokens remaining"))
            }
        })
        .await;
    // 100 000 − 100, give or take the refill of a token a second.
    assert!((99_890..=99_910).contains(&remaining), "{remaining}");
}

#[tokio::test]
async fn tokens_are_settled_to_the_usage_the_replica_reports_local() {
    settled_to_usage(Backend::Local).await;
}

#[tokio::test]
async fn tokens_are_settled_to_the_usage_the_replica_reports_redis() {
    settled_to_usage(Backend::Redis(RedisServer::start().await)).await;
}

/// A request that never reached a replica (none is reachable) gives its
/// reservation back: with one request a minute, each still gets the
/// pool's 503, never a 429.
#[tokio::test]
async fn a_request_that_never_ran_is_not_charged() {
    let dead = closed_port().await;
    // No cold wait: the dead replica's pool refuses at once.
    let pools = plain_pool(
        &[&dead],
        ", retry: {maxRetries: 0}, coldStart: {timeout: 0s}",
    );
    let gw = Gateway::start(&config(
        "  rateLimits: {global: {requestsPerMinute: 1}}\n",
        &pools,
    ))
    .await
    .unwrap();
    for _ in 0..3 {
        let r = chat(&gw, 10).await;
        assert_ne!(r.status(), 429, "{:?}", r.text().await);
        assert!(r.status().is_server_error(), "{}", r.status());
    }
}

/// A request larger than the whole limit can never pass: 429 with
/// `x-should-retry: false`, so the SDKs do not retry it.
#[tokio::test]
async fn a_request_larger_than_the_limit_is_told_not_to_retry() {
    let replica = counting_replica().await;
    let pools = plain_pool(&[&replica.addr.to_string()], "");
    let gw = Gateway::start(&config(
        "  rateLimits: {global: {tokensPerMinute: 500}}\n",
        &pools,
    ))
    .await
    .unwrap();
    let r = chat(&gw, 1000).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-should-retry"], "false");
    assert!(r.headers().get("retry-after").is_none());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "tokens");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Request too large for m on tokens per min (TPM)"),
        "{message}"
    );
}

/// Redis down: `allow` lets requests through and counts the errors,
/// `deny` refuses with 503; neither hangs.
#[tokio::test]
async fn an_unreachable_redis_is_decided_by_on_backend_error() {
    let replica = counting_replica().await;
    let pools = plain_pool(&[&replica.addr.to_string()], "");
    let nowhere = closed_port().await;
    for (choice, status) in [("allow", 200), ("deny", 503)] {
        let spec = format!(
            "  admin: {{address: \"127.0.0.1:0\"}}\n  rateLimits: {{backend: redis, onBackendError: {choice}, redis: {{url: \"redis://{nowhere}\"}}, global: {{requestsPerSecond: 1}}}}\n"
        );
        let gw = Gateway::start(&config(&spec, &pools)).await.unwrap();
        let started = Instant::now();
        for _ in 0..3 {
            let r = chat(&gw, 10).await;
            assert_eq!(r.status(), status, "{choice}");
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{choice} hung");
        let metrics = client()
            .get(format!("http://{}/metrics", gw.admin_addr().unwrap()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("infergate_rate_limit_backend_errors_total 3"),
            "{metrics}"
        );
    }
}

/// Two gateways sharing one Redis hold one limit: hammered at five times
/// the limit for 10 s, together they accept no more tokens than the limit
/// allows in that time (its burst plus its refill), and they do reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_redis_enforce_one_limit() {
    const PER_MINUTE: u64 = 6000;
    const RUN: Duration = Duration::from_secs(10);
    let redis = RedisServer::start().await;
    let replica = counting_replica().await;
    let pools = plain_pool(&[&replica.addr.to_string()], "");
    let spec = format!(
        "  rateLimits: {{backend: redis, redis: {{url: \"{}\", timeout: 1s}}, global: {{tokensPerMinute: {PER_MINUTE}}}}}\n",
        redis.url
    );
    let gateways = [
        Arc::new(Gateway::start(&config(&spec, &pools)).await.unwrap()),
        Arc::new(Gateway::start(&config(&spec, &pools)).await.unwrap()),
    ];
    // Each request uses 100 tokens (as the replica reports), and reserves
    // about as many. The limit allows PER_MINUTE at once, then PER_MINUTE
    // a minute: 7000 tokens (70 requests) in 10 s. Five times that is
    // 350 requests, 17.5 a second per gateway.
    let allowed = PER_MINUTE + PER_MINUTE * RUN.as_secs() / 60;
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut senders = Vec::new();
    for gw in &gateways {
        for _ in 0..2 {
            let (gw, accepted, refused) =
                (Arc::clone(gw), Arc::clone(&accepted), Arc::clone(&refused));
            senders.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(114));
                while started.elapsed() < RUN {
                    tick.tick().await;
                    let r = chat(&gw, 80).await;
                    match r.status().as_u16() {
                        200 => accepted.fetch_add(1, Ordering::Relaxed),
                        429 => refused.fetch_add(1, Ordering::Relaxed),
                        other => panic!("unexpected {other}: {:?}", r.text().await),
                    };
                    drop(r.bytes().await);
                }
            }));
        }
    }
    for s in senders {
        s.await.unwrap();
    }
    let tokens = accepted.load(Ordering::Relaxed) * 100;
    let refused = refused.load(Ordering::Relaxed);
    // Slack: the reservations of requests in flight when the run ends, and
    // the refill during the last request: 5 %.
    assert!(
        tokens <= allowed * 105 / 100,
        "{tokens} tokens accepted, {allowed} allowed"
    );
    assert!(
        tokens >= allowed * 85 / 100,
        "{tokens} tokens accepted, {allowed} allowed: starved"
    );
    assert!(
        refused > 100,
        "the load was not five times the limit: {refused} refused"
    );
}

/// A stream charged in tokens is settled to its usage even when its client
/// did not ask for usage: the gateway asks, and the client's stream is the
/// one it asked for, without the usage event. A client that asked keeps it.
#[tokio::test]
async fn a_stream_is_settled_to_its_usage_without_the_client_seeing_it() {
    let replica = sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale: 100.0,
            ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
        },
    )
    .await
    .unwrap();
    let pools = format!(
        "    - {{name: p, models: [m], endpoints: [\"{}\"]}}\n",
        replica.local_addr()
    );
    // Without `max_tokens`, 5000 are reserved for the answer; the replica
    // writes an answer of its own length.
    let gw = Gateway::start(&config(
        "  rateLimits: {defaultMaxTokens: 5000, global: {tokensPerDay: 1000000}}\n",
        &pools,
    ))
    .await
    .unwrap();
    let stream = |include_usage: Option<bool>| {
        let mut body = json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": "Tell me a story."}]});
        if let Some(include) = include_usage {
            body["stream_options"] = json!({"include_usage": include});
        }
        let url = format!("http://{}{CHAT}", gw.addr());
        async move {
            let r = client().post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let probe = || async {
        // Larger than the whole limit: refused, free, and it carries the
        // remaining count.
        let r = chat(&gw, 2_000_000).await;
        header(&r, "x-ratelimit-remaining-tokens")
    };

    for asked in [None, Some(false)] {
        let before = probe().await;
        let text = stream(asked).await;
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(
            !text.contains("\"usage\":{"),
            "the client did not ask for usage: {text}"
        );
        assert!(text.matches("data: ").count() > 2, "{text}");
        // Charged what it used: its completion (one token an event here)
        // and its prompt (a dozen tokens), not the 5000 reserved.
        let completion = text.matches("\"delta\":{\"content\"").count() as u64;
        assert!(
            completion < 4000,
            "{completion} tokens: too close to the reservation to tell"
        );
        let charged =
            crate::support::poll_until(Duration::from_secs(10), "the settlement", || async {
                let spent = before.saturating_sub(probe().await);
                if (completion..completion + 64).contains(&spent) {
                    Ok(spent)
                } else {
                    Err(format!(
                        "{spent} charged for {completion} completion tokens"
                    ))
                }
            })
            .await;
        assert!(charged > 0, "{asked:?}");
    }
    let text = stream(Some(true)).await;
    assert!(
        text.contains("\"usage\":{"),
        "the client asked for usage: {text}"
    );
}

/// Limits shared through a Redis that speaks only TLS and asks for a
/// client certificate: with the right CA and certificate the limit holds
/// (the second request of a one-a-minute limit is refused), and with a CA
/// that did not sign Redis's certificate no connection is made, so
/// `onBackendError: deny` answers 503 rather than the request going
/// through unchecked.
#[tokio::test]
async fn limits_are_shared_through_redis_over_tls() {
    use crate::support::redis::TlsFiles;
    use crate::support::tls::{Ca, Files, Key};
    let ca = Ca::new("redis ca");
    let server = Files::new(&ca.server(&["127.0.0.1"], Key::EcdsaPkcs8));
    server.write_ca(&ca);
    let redis = RedisServer::start_tls(TlsFiles {
        cert: &server.cert,
        key: &server.key,
        client_ca: Some(&server.ca),
    })
    .await;
    let client_cert = Files::new(&ca.client("gateway", "gateway.local"));
    let stranger = Files::new(&Ca::new("another ca").server(&["127.0.0.1"], Key::EcdsaPkcs8));
    stranger.write_ca(&Ca::new("a third ca"));
    let replica = counting_replica().await;
    let pools = plain_pool(&[&replica.addr.to_string()], "");
    let spec = |ca: &std::path::Path| {
        format!(
            "  rateLimits: {{backend: redis, onBackendError: deny, global: {{requestsPerMinute: 1}}, \
             redis: {{url: \"{}\", timeout: 2s, tls: {{caFile: \"{}\", certFile: \"{}\", keyFile: \"{}\"}}}}}}\n",
            redis.url,
            ca.display(),
            client_cert.cert.display(),
            client_cert.key.display(),
        )
    };

    let gw = Gateway::start(&config(&spec(&server.ca), &pools))
        .await
        .unwrap();
    let statuses = [chat(&gw, 10).await.status(), chat(&gw, 10).await.status()];
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    drop(gw);

    let gw = Gateway::start(&config(&spec(&stranger.ca), &pools))
        .await
        .unwrap();
    assert_eq!(
        chat(&gw, 10).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// A Redis CA file that cannot be read stops the gateway from starting,
/// naming the field and the file.
#[tokio::test]
async fn an_unreadable_redis_ca_file_is_refused_at_start() {
    let replica = counting_replica().await;
    let pools = plain_pool(&[&replica.addr.to_string()], "");
    let spec = "  rateLimits: {backend: redis, global: {requestsPerMinute: 1}, \
                redis: {url: \"rediss://127.0.0.1:1\", tls: {caFile: \"/nonexistent/ca.pem\"}}}\n";
    let error = Gateway::start(&config(spec, &pools))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.contains("caFile") && error.contains("/nonexistent/ca.pem"),
        "{error}"
    );
}
