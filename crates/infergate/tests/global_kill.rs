//! A global tier as separate processes: a member gateway killed with
//! SIGKILL (no drain, every connection reset) under steady streaming load.
//! Streams that had begun at the dead member may be cut, and each then
//! ends with an error event; every other request is answered, retried on
//! the other member when it had not started; and the router stops
//! sending the dead member requests within `unhealthyAfter`.

#[path = "support/served.rs"]
mod served;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use served::{Served, write_config};

const UNHEALTHY_AFTER_MS: u64 = 1000;

/// One request through the router.
#[derive(Debug, Clone)]
struct Answer {
    sent: Instant,
    /// `x-infergate-member` of the answer, when a head came.
    member: Option<String>,
    /// A 200 head came: the stream had begun for the client.
    begun: bool,
    outcome: Result<(), String>,
}

type Answers = Arc<Mutex<Vec<Answer>>>;

fn member_config() -> String {
    "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{name: public, address: \"127.0.0.1:0\"}]
  admin: {address: \"127.0.0.1:0\"}
  pools:
    - {name: p, models: [m], simulated: {replicas: 1, hardware: [h100], model: llama-3.1-8b, timeScale: 1}}
"
    .to_owned()
}

fn router_config(members: &[(String, String)]) -> String {
    let listed: String = members
        .iter()
        .enumerate()
        .map(|(i, (public, admin))| {
            format!("      - {{name: m{i}, url: \"http://{public}\", adminUrl: \"http://{admin}\", region: r}}\n")
        })
        .collect();
    format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  pools: []
  global:
    region: r
    failover: {{unhealthyAfter: {UNHEALTHY_AFTER_MS}ms, rampUp: 3s}}
    members:
{listed}"
    )
}

async fn stream_once(client: &reqwest::Client, router: &str) -> Answer {
    let sent = Instant::now();
    let mut answer = Answer {
        sent,
        member: None,
        begun: false,
        outcome: Ok(()),
    };
    let response = client
        .post(format!("http://{router}/v1/chat/completions"))
        .json(
            &serde_json::json!({"model": "m", "stream": true, "max_tokens": 48,
            "messages": [{"role": "user", "content": "hello there"}]}),
        )
        .send()
        .await;
    let mut response = match response {
        Ok(r) => r,
        Err(e) => {
            answer.outcome = Err(format!("no answer: {e}"));
            return answer;
        }
    };
    answer.member = response
        .headers()
        .get("x-infergate-member")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if response.status() != 200 {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        answer.outcome = Err(format!("{status}: {body}"));
        return answer;
    }
    answer.begun = true;
    let mut text = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(c)) => text.extend_from_slice(&c),
            Ok(None) => break,
            Err(e) => {
                answer.outcome = Err(format!("cut without an error event: {e}"));
                return answer;
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    if text.contains("\"error\"") {
        answer.outcome = Err(format!("error event: {text}"));
    } else if !text.contains("data: [DONE]") {
        answer.outcome = Err(format!("incomplete stream: {text}"));
    }
    answer
}

async fn member_page(client: &reqwest::Client, admin: &str) -> serde_json::Value {
    client
        .get(format!("http://{admin}/debug/members"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn state_of(page: &serde_json::Value, member: &str) -> String {
    page["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == member)
        .map(|m| m["state"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// `infergate_member_requests_total{member}`, every outcome, from the
/// router's exposition.
async fn attempts_to(client: &reqwest::Client, admin: &str, member: &str) -> f64 {
    let text = client
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let label = format!("member=\"{member}\"");
    text.lines()
        .filter(|l| l.starts_with("infergate_member_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Poll `look` every 50 ms until it gives a value, for at most `limit`.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    limit: Duration,
    what: &str,
    mut look: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = look().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_outright_cuts_only_its_begun_streams_and_leaves_rotation() {
    let member_file = write_config(&member_config());
    let mut members: Vec<Served> = (0..2).map(|_| Served::start(member_file.path())).collect();
    let addrs: Vec<(String, String)> = members
        .iter()
        .map(|m| (m.addr.clone(), m.admin_addr()))
        .collect();
    let router_file = write_config(&router_config(&addrs));
    let router = Served::start(router_file.path());
    let router_admin = router.admin_addr();
    let public = router.addr.clone();
    let client = reqwest::Client::new();
    until(Duration::from_secs(20), "both members healthy", || async {
        let page = member_page(&client, &router_admin).await;
        (state_of(&page, "m0") == "healthy" && state_of(&page, "m1") == "healthy").then_some(())
    })
    .await;

    // Steady streaming load: six clients, each one request after another.
    let answers: Answers = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..6)
        .map(|_| {
            let (answers, stop, client, public) = (
                Arc::clone(&answers),
                Arc::clone(&stop),
                client.clone(),
                public.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let answer = stream_once(&client, &public).await;
                    answers.lock().unwrap().push(answer);
                }
            })
        })
        .collect();
    let count = || answers.lock().unwrap().len();
    let to_m1 = || {
        answers
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.member.as_deref() == Some("m1"))
            .count()
    };
    until(Duration::from_secs(30), "load on both members", || async {
        (count() >= 20 && to_m1() >= 5).then_some(())
    })
    .await;

    // SIGKILL: no drain, every open connection reset by the kernel.
    let killed = Instant::now();
    members[1].child.kill().unwrap();
    members[1].child.wait().unwrap();
    let down_after = until(Duration::from_secs(10), "m1 out of rotation", || async {
        let page = member_page(&client, &router_admin).await;
        (state_of(&page, "m1") == "unhealthy").then(|| killed.elapsed())
    })
    .await;
    let attempts_at_down = attempts_to(&client, &router_admin, "m1").await;
    let after_kill = count();
    until(Duration::from_secs(30), "traffic without m1", || async {
        (count() >= after_kill + 30).then_some(())
    })
    .await;
    let attempts_later = attempts_to(&client, &router_admin, "m1").await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }

    let answers = answers.lock().unwrap().clone();
    let (mut cut, mut retried_elsewhere) = (0, 0);
    for a in &answers {
        let begun_at_the_dead_member =
            a.begun && a.member.as_deref() == Some("m1") && a.sent < killed;
        match &a.outcome {
            Ok(()) => {}
            Err(e) if begun_at_the_dead_member => {
                assert!(
                    e.starts_with("error event"),
                    "cut without an error event: {e}"
                );
                cut += 1;
            }
            Err(e) => panic!("a request that had not begun at the dead member failed: {e} ({a:?})"),
        }
        if a.sent >= killed && a.member.as_deref() == Some("m0") {
            retried_elsewhere += 1;
        }
    }
    assert_eq!(
        attempts_later, attempts_at_down,
        "the router sent m1 requests after taking it out of rotation"
    );
    assert!(retried_elsewhere >= 30, "{retried_elsewhere}");
    println!(
        "m1 killed: out of rotation after {:.0} ms (unhealthyAfter {UNHEALTHY_AFTER_MS} ms); {} requests, {cut} streams cut with an error event, every other answered",
        down_after.as_secs_f64() * 1e3,
        answers.len()
    );
    drop(router);
    drop(members);
}
