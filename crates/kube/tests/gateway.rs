//! A gateway whose pool is found by label, in front of simulated replicas
//! each on its own loopback address (the "pod IP"), all on one port, with
//! the API server double as the cluster.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gateway::Gateway;
use infergate_kube::Discoveries;
use infergate_kube::testing::{ApiServer, Resource, pod};
use parking_lot::Mutex;

const NS: &str = "ml";
const WAIT: Duration = Duration::from_secs(20);

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// A port free on 127.0.0.2; the replicas all listen on it, each on its
/// own address.
fn free_port() -> u16 {
    std::net::TcpListener::bind((ip(2), 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn replica(n: u8, port: u16, dialect: sim::Dialect) -> sim::ReplicaHandle {
    let spec = sim::ReplicaSpec {
        served_model_name: Some("m".into()),
        time_scale: 20.0,
        dialect,
        seed: u64::from(n),
        ..sim::ReplicaSpec::default()
    };
    sim::start_replica(SocketAddr::new(ip(n), port), spec)
        .await
        .unwrap()
}

fn pod_named(n: u8) -> String {
    format!("vllm-{n}")
}

fn ready_pod(n: u8, labels: &[(&str, &str)]) -> serde_json::Value {
    let mut all = vec![("app", "vllm")];
    all.extend_from_slice(labels);
    pod(&pod_named(n), Some(&ip(n).to_string()), &all, true)
}

fn gateway_config(port: u16, weights: &str) -> config::InferenceGatewayConfig {
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  pools:
    - name: p
      engine: vllm
      models: [m]
      endpointSelector: {{namespace: {NS}, matchLabels: {{app: vllm}}, port: {port}}}
      scheduling: {{metrics: {{interval: 50ms}}{weights}}}
"
    );
    config::from_yaml(&yaml).unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn endpoints(gw: &Gateway) -> Vec<String> {
    let mut addrs = gw.pool_endpoints().remove(0).1;
    addrs.sort();
    addrs
}

async fn wait_endpoints(gw: &Gateway, want: &[String]) {
    let end = tokio::time::Instant::now() + WAIT;
    while endpoints(gw) != want {
        assert!(
            tokio::time::Instant::now() < end,
            "endpoints {:?}, want {want:?}",
            endpoints(gw)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn addr(n: u8, port: u16) -> String {
    SocketAddr::new(ip(n), port).to_string()
}

/// One streaming request through the gateway, as the load sends it.
#[derive(Debug, Clone)]
struct Record {
    started: Instant,
    endpoint: String,
    status: u16,
    complete: bool,
}

async fn stream_once(client: &reqwest::Client, gw: SocketAddr) -> Record {
    let started = Instant::now();
    let response = client
        .post(format!("http://{gw}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model": "m", "stream": true, "max_tokens": 12, "messages": [{"role": "user", "content": "count to ten"}]}"#)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let endpoint = response
        .headers()
        .get("x-infergate-endpoint")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.bytes().await.unwrap();
    let complete = body.ends_with(b"data: [DONE]\n\n");
    Record {
        started,
        endpoint,
        status,
        complete,
    }
}

/// A bounded load of streaming requests from `workers` clients until
/// stopped.
struct Load {
    records: Arc<Mutex<Vec<Record>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The most requests one load worker sends.
const MAX_PER_WORKER: usize = 2_000;

impl Load {
    fn start(gw: SocketAddr, workers: usize) -> Load {
        let records: Arc<Mutex<Vec<Record>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..workers)
            .map(|_| {
                let (records, stop) = (records.clone(), stop.clone());
                tokio::spawn(async move {
                    let client = client();
                    for _ in 0..MAX_PER_WORKER {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let record = stream_once(&client, gw).await;
                        records.lock().push(record);
                    }
                })
            })
            .collect();
        Load {
            records,
            stop,
            tasks,
        }
    }

    fn count(&self) -> usize {
        self.records.lock().len()
    }

    async fn until(&self, what: &str, condition: impl Fn(&[Record]) -> bool) {
        let end = tokio::time::Instant::now() + WAIT;
        while !condition(&self.records.lock()) {
            assert!(
                tokio::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn finish(self) -> Vec<Record> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        Arc::try_unwrap(self.records).unwrap().into_inner()
    }
}

/// Requests a simulated replica has taken: running, waiting and finished,
/// in vLLM's or SGLang's names.
async fn received(replica: &str) -> f64 {
    let text = client()
        .get(format!("http://{replica}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            [
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:request_success_total",
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:num_requests_total",
            ]
            .iter()
            .any(|name| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn gateway_metrics(gw: &Gateway) -> String {
    client()
        .get(format!("http://{}/metrics", gw.admin_addr().unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn wait_metrics(gw: &Gateway, what: &str, condition: impl Fn(&str) -> bool) {
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        let text = gateway_metrics(gw).await;
        if condition(&text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "never {what}; /metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_2_to_6_to_1_under_streaming_load_loses_no_request() {
    let server = ApiServer::start().await;
    let port = free_port();
    let mut replicas: HashMap<u8, sim::ReplicaHandle> = HashMap::new();
    for n in [2, 3] {
        replicas.insert(n, replica(n, port, sim::Dialect::Vllm).await);
        server.put(&Resource::PODS, NS, ready_pod(n, &[]));
    }
    let config = gateway_config(port, "");
    let gw = Gateway::start(&config).await.unwrap();
    let mut discoveries = Discoveries::with_client(server.client());
    discoveries.sync(&config, &gw);
    wait_endpoints(&gw, &[addr(2, port), addr(3, port)]).await;

    let load = Load::start(gw.addr(), 6);
    load.until("first requests", |r| r.len() >= 10).await;

    // 2 → 6. Replica 7 speaks SGLang's metrics, said by its pod's label:
    // it is picked only if the gateway scrapes it in that dialect.
    for n in 4..=7 {
        let dialect = if n == 7 {
            sim::Dialect::Sglang
        } else {
            sim::Dialect::Vllm
        };
        replicas.insert(n, replica(n, port, dialect).await);
        let labels: &[(&str, &str)] = if n == 7 {
            &[("infergate.dev/engine", "sglang")]
        } else {
            &[]
        };
        server.put(&Resource::PODS, NS, ready_pod(n, labels));
    }
    let six: Vec<String> = (2..=7).map(|n| addr(n, port)).collect();
    wait_endpoints(&gw, &six).await;
    load.until("traffic on every new replica", |records| {
        six.iter().all(|a| records.iter().any(|r| &r.endpoint == a))
    })
    .await;

    // 6 → 1, every way a pod stops being a replica.
    server.delete(&Resource::PODS, NS, &pod_named(3));
    server.put(
        &Resource::PODS,
        NS,
        pod(
            &pod_named(4),
            Some(&ip(4).to_string()),
            &[("app", "vllm")],
            false,
        ),
    );
    server.mark_terminating(&Resource::PODS, NS, &pod_named(5));
    server.delete(&Resource::PODS, NS, &pod_named(6));
    server.put(
        &Resource::PODS,
        NS,
        pod(
            &pod_named(7),
            Some(&ip(7).to_string()),
            &[("app", "retired")],
            true,
        ),
    );
    wait_endpoints(&gw, &[addr(2, port)]).await;
    let removed_at = Instant::now();
    let before = load.count();
    load.until("requests after the scale-down", |r| r.len() >= before + 30)
        .await;
    let records = load.finish().await;

    let total = records.len();
    assert!(
        records.iter().all(|r| r.status == 200),
        "every request answered 200"
    );
    assert!(
        records.iter().all(|r| r.complete),
        "every stream ran to [DONE]"
    );
    for n in 3..=7 {
        let gone = addr(n, port);
        let late: Vec<_> = records
            .iter()
            .filter(|r| r.endpoint == gone && r.started >= removed_at)
            .collect();
        assert!(
            late.is_empty(),
            "{} requests went to {gone} after it left",
            late.len()
        );
        // The replica saw exactly the requests the gateway says it sent.
        let sent = records.iter().filter(|r| r.endpoint == gone).count();
        assert_eq!(
            received(&gone).await,
            sent as f64,
            "requests received by {gone}"
        );
    }
    assert!(total > before + 30);

    // The leavers' series go once their last request has ended.
    wait_metrics(&gw, "the leavers' series removed", |text| {
        (3..=7).all(|n| !text.contains(&format!("endpoint=\"{}\"", addr(n, port))))
            && text.contains(&format!("endpoint=\"{}\"", addr(2, port)))
    })
    .await;
    drop(replicas);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_leaves_the_last_replicas_serving() {
    let server = ApiServer::start().await;
    let port = free_port();
    let mut replicas = Vec::new();
    for n in [2, 3] {
        replicas.push(replica(n, port, sim::Dialect::Vllm).await);
        server.put(&Resource::PODS, NS, ready_pod(n, &[]));
    }
    let config = gateway_config(port, "");
    let gw = Gateway::start(&config).await.unwrap();
    let mut discoveries = Discoveries::with_client(server.client());
    discoveries.sync(&config, &gw);
    let both = [addr(2, port), addr(3, port)];
    wait_endpoints(&gw, &both).await;
    wait_metrics(&gw, "discovery up", |t| {
        t.contains("infergate_discovery_up{pool=\"p\"} 1")
    })
    .await;

    server.set_down(true);
    wait_metrics(&gw, "discovery down", |t| {
        t.contains("infergate_discovery_up{pool=\"p\"} 0")
            && t.contains("infergate_discovery_errors_total{pool=\"p\"}")
            && !t.contains("infergate_discovery_errors_total{pool=\"p\"} 0\n")
    })
    .await;
    let client = client();
    for _ in 0..10 {
        let record = stream_once(&client, gw.addr()).await;
        assert_eq!(record.status, 200);
        assert!(record.complete);
    }
    assert_eq!(endpoints(&gw), both, "the last known replicas keep serving");

    server.set_down(false);
    wait_metrics(&gw, "discovery up again", |t| {
        t.contains("infergate_discovery_up{pool=\"p\"} 1")
    })
    .await;

    // A reload (new weights) keeps the discovered replicas and the watch.
    let reloaded = gateway_config(port, ", weights: {queue: 3}");
    gw.apply(&reloaded).unwrap();
    discoveries.sync(&reloaded, &gw);
    assert_eq!(endpoints(&gw), both);

    server.delete(&Resource::PODS, NS, &pod_named(3));
    wait_endpoints(&gw, &[addr(2, port)]).await;
}

/// A pool found by label, with no pod yet, that wakes its Deployment
/// through the scale subresource.
fn cold_config(port: u16) -> config::InferenceGatewayConfig {
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  pools:
    - name: p
      engine: vllm
      models: [m]
      endpointSelector: {{namespace: {NS}, matchLabels: {{app: vllm}}, port: {port}}}
      scheduling: {{metrics: {{interval: 50ms}}}}
      coldStart: {{timeout: 60s, wake: {{kind: Deployment, name: vllm, namespace: {NS}}}}}
"
    );
    config::from_yaml(&yaml).unwrap()
}

/// Two gateway replicas find the pool cold at once: 200 requests of every
/// band wait in them, the Deployment is scaled from 0 to 1 once (the
/// scale writes carry the resourceVersion they read, so the second
/// gateway's write conflicts and it finds the count raised), and when the
/// pod the Deployment makes is ready every request is answered, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_wake_a_cold_deployment_once_and_answer_every_waiting_request() {
    const PER_GATEWAY: usize = 100;
    let server = ApiServer::start().await;
    let port = free_port();
    server.put(
        &Resource::DEPLOYMENTS,
        NS,
        serde_json::json!({"metadata": {"name": "vllm"}, "spec": {"replicas": 0}}),
    );
    let config = cold_config(port);
    let gateways = [
        Gateway::start(&config).await.unwrap(),
        Gateway::start(&config).await.unwrap(),
    ];
    let mut discoveries = Vec::new();
    for gw in &gateways {
        let mut d = Discoveries::with_client(server.client());
        d.sync(&config, gw);
        discoveries.push(d);
    }
    let bands = ["critical", "standard", "sheddable"];
    let mut answers = Vec::new();
    for gw in &gateways {
        for i in 0..PER_GATEWAY {
            let request = client()
                .post(format!("http://{}/v1/chat/completions", gw.addr()))
                .header("content-type", "application/json")
                .header("x-infergate-priority", bands[i % 3])
                .body(r#"{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}"#);
            answers.push(tokio::spawn(async move { request.send().await.unwrap() }));
        }
    }
    for gw in &gateways {
        wait_metrics(gw, "every request waiting for the cold pool", |t| {
            t.contains(&format!(
                "infergate_cold_waiting_requests{{pool=\"p\"}} {PER_GATEWAY}\n"
            )) && t.contains("inference_pool_ready_pods{name=\"p\"} 0\n")
        })
        .await;
    }
    server
        .wait_for("the Deployment scaled up", WAIT, |s| {
            s.get(&Resource::DEPLOYMENTS, NS, "vllm")
                .and_then(|d| d.pointer("/spec/replicas").and_then(|r| r.as_i64()))
                == Some(1)
        })
        .await;
    // The Deployment's controller: its pod starts and becomes ready.
    let replica = replica(2, port, sim::Dialect::Vllm).await;
    server.put(&Resource::PODS, NS, ready_pod(2, &[]));
    for answer in answers {
        let response = answer.await.unwrap();
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["object"], "chat.completion");
    }
    let deployment = server.get(&Resource::DEPLOYMENTS, NS, "vllm").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(
        deployment["metadata"]["generation"], 2,
        "the spec changed once: one wake-up for both gateways"
    );
    let served = received(&addr(2, port)).await;
    drop(replica);
    assert_eq!(
        served,
        (2 * PER_GATEWAY) as f64,
        "each request answered once"
    );
    for gw in &gateways {
        let text = gateway_metrics(gw).await;
        assert!(text.contains("infergate_cold_waiting_requests{pool=\"p\"} 0\n"));
        assert!(text.contains("infergate_cold_starts_total{pool=\"p\"} 1\n"));
        assert!(text.contains("inference_pool_ready_pods{name=\"p\"} 1\n"));
    }
}

/// A scale-up by a gateway leaves a workload that already asks for
/// enough replicas alone, and raises one that asks for fewer.
#[tokio::test]
async fn the_scaler_raises_the_scale_only_below_the_target() {
    use gateway::{ScaledUp, Scaler, Workload};
    let server = ApiServer::start().await;
    server.put(
        &Resource::STATEFULSETS,
        NS,
        serde_json::json!({"metadata": {"name": "sglang"}, "spec": {"replicas": 3}}),
    );
    server.put(
        &Resource::LEADER_WORKER_SETS,
        NS,
        serde_json::json!({"metadata": {"name": "big"}, "spec": {"replicas": 0}}),
    );
    let scaler = infergate_kube::scale::WorkloadScaler::new(server.client());
    let workload = |kind, name: &str, replicas| Workload {
        kind,
        name: name.to_owned(),
        namespace: Some(NS.to_owned()),
        replicas,
    };
    let kept = scaler
        .scale_up(workload(config::WorkloadKind::StatefulSet, "sglang", 2))
        .await
        .unwrap();
    assert_eq!(kept, ScaledUp::Already(3));
    let raised = scaler
        .scale_up(workload(config::WorkloadKind::LeaderWorkerSet, "big", 2))
        .await
        .unwrap();
    assert_eq!(raised, ScaledUp::Raised { from: 0, to: 2 });
    let big = server
        .get(&Resource::LEADER_WORKER_SETS, NS, "big")
        .unwrap();
    assert_eq!(big["spec"]["replicas"], 2);
    let missing = scaler
        .scale_up(workload(config::WorkloadKind::Deployment, "absent", 1))
        .await
        .unwrap_err();
    assert!(missing.contains("absent"), "{missing}");
}

/// A disaggregated pool whose decode and prefill replicas are both found
/// by label (`llm-d.ai/role`): the prefill group follows its pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_group_found_by_label_follows_its_pods() {
    let server = ApiServer::start().await;
    let port = free_port();
    let with_role = |n: u8, role: sim::Role| sim::ReplicaSpec {
        served_model_name: Some("m".into()),
        time_scale: 20.0,
        seed: u64::from(n),
        disaggregation: sim::DisaggregationSpec {
            role,
            ..sim::DisaggregationSpec::default()
        },
        ..sim::ReplicaSpec::default()
    };
    let _decode = sim::start_replica(
        SocketAddr::new(ip(2), port),
        with_role(2, sim::Role::Decode),
    )
    .await
    .unwrap();
    let prefill = sim::start_replica(
        SocketAddr::new(ip(3), port),
        with_role(3, sim::Role::Prefill),
    )
    .await
    .unwrap();
    server.put(
        &Resource::PODS,
        NS,
        ready_pod(2, &[("llm-d.ai/role", "decode")]),
    );
    server.put(
        &Resource::PODS,
        NS,
        ready_pod(3, &[("llm-d.ai/role", "prefill")]),
    );
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  pools:
    - name: p
      engine: vllm
      models: [m]
      endpointSelector: {{namespace: {NS}, matchLabels: {{llm-d.ai/role: decode}}, port: {port}}}
      scheduling: {{metrics: {{interval: 50ms}}}}
      disaggregation:
        protocol: vllm
        prefill:
          endpointSelector: {{namespace: {NS}, matchLabels: {{llm-d.ai/role: prefill}}, port: {port}}}
"
    );
    let config = config::from_yaml(&yaml).unwrap();
    let gw = Gateway::start(&config).await.unwrap();
    let mut discoveries = Discoveries::with_client(server.client());
    discoveries.sync(&config, &gw);
    wait_endpoints(&gw, &[addr(2, port)]).await;
    let prefills = || async {
        let admin = gw.admin_addr().unwrap();
        let pools: serde_json::Value = client()
            .get(format!("http://{admin}/debug/pools"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        pools["pools"][0]["disaggregation"]["prefill"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["address"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let end = tokio::time::Instant::now() + WAIT;
    while prefills().await != [addr(3, port)] {
        assert!(
            tokio::time::Instant::now() < end,
            "prefill group {:?}",
            prefills().await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let long = "the quarterly report says revenue grew while costs fell ".repeat(300);
    let body = serde_json::json!({"model": "m", "max_tokens": 4,
        "messages": [{"role": "user", "content": long}]});
    let send = || async {
        client()
            .post(format!("http://{}/v1/chat/completions", gw.addr()))
            .json(&body)
            .send()
            .await
            .unwrap()
    };
    assert_eq!(send().await.status(), 200);
    let prefilled = || async {
        let text = client()
            .get(format!("http://{}/metrics", prefill.local_addr()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with("vllm:request_success_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert_eq!(
        prefilled().await,
        1.0,
        "the discovered prefill replica computed the prompt"
    );

    // Its pod gone, the group is empty: the decode replica does it all.
    server.delete(&Resource::PODS, NS, &pod_named(3));
    let end = tokio::time::Instant::now() + WAIT;
    while !prefills().await.is_empty() {
        assert!(
            tokio::time::Instant::now() < end,
            "prefill group {:?}",
            prefills().await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(send().await.status(), 200);
    assert_eq!(prefilled().await, 1.0);
}
