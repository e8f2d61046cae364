//! Pools whose replicas are simulated: started in this process on free
//! local ports and handed to the gateway as the pools' endpoints. A reload
//! keeps a pool's fleet when its simulation is unchanged, so its replicas
//! (and the requests on them) carry on.

/// The simulated fleets running now, one per simulated pool.
#[derive(Default)]
pub struct Fleets {
    running: Vec<Running>,
}

struct Running {
    key: Key,
    fleet: sim::Fleet,
}

/// What a fleet was started from: a pool with the same key can use it.
#[derive(PartialEq)]
struct Key {
    pool: String,
    simulated: config::Simulated,
    /// The replicas' scheduling policy, which may follow the pool's
    /// `enginePriority`.
    scheduling: config::EngineScheduling,
    served_model: String,
    adapters: Vec<String>,
    /// The topic the replicas publish their KV-cache events under, when
    /// the pool follows them.
    kv_events: Option<String>,
}

/// Fleets for a config about to be applied: reused ones by position in
/// [`Fleets::running`], new ones already started.
pub struct Prepared {
    plan: Vec<Planned>,
}

enum Planned {
    Reused(usize),
    // Boxed: a running fleet's key is large, the index small.
    Started(Box<Running>),
}

impl Fleets {
    /// Start what `config`'s simulated pools need and list their replicas
    /// in `endpoints`. Nothing running stops until [`Fleets::commit`].
    pub async fn prepare(
        &self,
        config: &mut config::InferenceGatewayConfig,
    ) -> anyhow::Result<Prepared> {
        let mut plan = Vec::new();
        for pool in &mut config.spec.pools {
            let Some(simulated) = &pool.simulated else {
                continue;
            };
            let key = Key {
                pool: pool.name.clone(),
                simulated: simulated.clone(),
                scheduling: scheduling(pool),
                served_model: pool.base_model().to_owned(),
                adapters: pool.adapters.clone(),
                kv_events: (pool.prefix_cache.source == config::PrefixSource::Events)
                    .then(|| pool.prefix_cache.topic.clone().unwrap_or_default()),
            };
            let planned = match self.running.iter().position(|r| r.key == key) {
                Some(i) => Planned::Reused(i),
                None => Planned::Started(Box::new(Running {
                    fleet: start(&key).await?,
                    key,
                })),
            };
            let fleet = match &planned {
                Planned::Reused(i) => &self.running[*i].fleet,
                Planned::Started(r) => &r.fleet,
            };
            pool.endpoints = fleet.addrs().iter().map(ToString::to_string).collect();
            // A fleet that starts at zero is woken by the gateway's first
            // request that finds it cold.
            if let Some(url) = fleet.wake_url() {
                pool.cold_start.wake = Some(config::Wake {
                    webhook: Some(url),
                    ..config::Wake::default()
                });
            }
            // Every replica publishes on ports of its own.
            for replica in fleet.replicas() {
                let info = replica.info();
                if let Some(endpoint) = &info.kv_events_endpoint {
                    pool.prefix_cache.publishers.insert(
                        info.addr.to_string(),
                        config::Publisher {
                            endpoint: endpoint.clone(),
                            replay_endpoint: info.kv_events_replay_endpoint.clone(),
                        },
                    );
                }
            }
            plan.push(planned);
        }
        Ok(Prepared { plan })
    }

    /// The config `prepared` was made for is in force: fleets it does not
    /// use stop now.
    pub fn commit(&mut self, prepared: Prepared) {
        let mut old: Vec<Option<Running>> = self.running.drain(..).map(Some).collect();
        self.running = prepared
            .plan
            .into_iter()
            .filter_map(|p| match p {
                Planned::Reused(i) => old[i].take(),
                Planned::Started(r) => Some(*r),
            })
            .collect();
    }
}

async fn start(key: &Key) -> anyhow::Result<sim::Fleet> {
    let mut fleet = fleet_spec(
        &key.simulated,
        key.scheduling,
        &key.served_model,
        &key.adapters,
    );
    // Free ports, a replay socket each: what a vLLM started with
    // `--kv-events-config` and a replay endpoint publishes.
    fleet.kv_events = key.kv_events.as_ref().map(|topic| sim::KvEventsSpec {
        port: 0,
        replay_port: Some(0),
        topic: topic.clone(),
        ..sim::KvEventsSpec::default()
    });
    sim::start_fleet(fleet).await.map_err(|e| {
        anyhow::anyhow!(
            "pool {:?}: cannot start simulated replicas: {e:#}",
            key.pool
        )
    })
}

/// The fleet a simulated pool runs: what `serve` starts and `check` checks.
fn fleet_spec(
    spec: &config::Simulated,
    scheduling: config::EngineScheduling,
    served_model: &str,
    adapters: &[String],
) -> sim::FleetSpec {
    sim::FleetSpec {
        replicas: spec.replicas,
        hardware: spec.hardware.clone(),
        model: spec.model.clone(),
        served_model_name: Some(served_model.to_owned()),
        tensor_parallel: spec.tensor_parallel,
        adapters: adapters.to_vec(),
        max_loras: spec.max_loras,
        scheduling_policy: match scheduling {
            config::EngineScheduling::Fcfs => sim::SchedulingPolicy::Fcfs,
            config::EngineScheduling::Priority => sim::SchedulingPolicy::Priority,
        },
        time_scale: spec.time_scale.unwrap_or(config::defaults::SIM_TIME_SCALE),
        seed: spec.seed.unwrap_or_default(),
        load_time: spec
            .load_time
            .as_deref()
            .and_then(|t| t.parse().ok())
            .unwrap_or_default(),
        start_asleep: spec.start_at_zero,
        ..sim::FleetSpec::default()
    }
}

/// The scheduling policy of a simulated pool's replicas.
fn scheduling(pool: &config::Pool) -> config::EngineScheduling {
    pool.simulated_scheduling()
        .expect("called for simulated pools only")
}

/// What the simulator would refuse in the simulated pools of `config`,
/// without starting anything: the checks `serve` makes before it starts a
/// pool's replicas ([`sim::FleetSpec::validate`]), each reported at the
/// field to change and in the config's terms. Pools with a value that
/// could not be read are left alone (that value is reported already), as
/// are problems the config's own checks report (no replicas, no hardware).
pub fn problems(
    config: &config::InferenceGatewayConfig,
    unreadable: &config::Unreadable,
) -> Vec<config::Problem> {
    let mut problems = Vec::new();
    for (i, pool) in config.spec.pools.iter().enumerate() {
        let Some(simulated) = &pool.simulated else {
            continue;
        };
        let at = Fields(format!("spec.pools[{i}].simulated"));
        let read = [
            &at.0,
            &format!("spec.pools[{i}].models"),
            &format!("spec.pools[{i}].adapters"),
        ]
        .into_iter()
        .all(|path| unreadable.was_read(path));
        if !read || simulated.replicas == 0 || simulated.hardware.is_empty() {
            continue;
        }
        let fleet = fleet_spec(
            simulated,
            scheduling(pool),
            pool.base_model(),
            &pool.adapters,
        );
        let mut found = Vec::new();
        pool_problems(&fleet, &pool.adapters, &at, &mut found);
        if found.is_empty()
            && let Err(e) = fleet.validate()
        {
            found.push(at.problem(
                "",
                format!("the simulator cannot start these replicas: {e:#}"),
            ));
        }
        for problem in found {
            if !problems.contains(&problem) {
                problems.push(problem);
            }
        }
    }
    problems
}

/// Paths under one pool's `simulated`.
struct Fields(String);

impl Fields {
    fn problem(&self, field: &str, message: String) -> config::Problem {
        let path = if field.is_empty() {
            self.0.clone()
        } else {
            format!("{}.{field}", self.0)
        };
        config::Problem { path, message }
    }
}

fn pool_problems(
    fleet: &sim::FleetSpec,
    adapters: &[String],
    at: &Fields,
    found: &mut Vec<config::Problem>,
) {
    use sim::engine::{hardware, hardware_names, model, model_names};

    let known_model = model(&fleet.model).is_some();
    if !known_model {
        found.push(at.problem(
            "model",
            format!(
                "{:?} is not a model the simulator knows; known: {} (or their Hugging Face ids)",
                fleet.model,
                model_names().join(", ")
            ),
        ));
    }
    if !adapters.is_empty() && fleet.max_loras == Some(0) {
        found.push(at.problem(
            "maxLoras",
            format!(
                "0 turns LoRA off, but the pool serves adapters ({}); use maxLoras: 1 or more",
                adapters.join(", ")
            ),
        ));
    }
    // The replicas use the first `replicas` entries, as `serve` checks.
    let mut checked = Vec::new();
    for (h, name) in fleet.hardware.iter().enumerate().take(fleet.replicas) {
        let Some(gpu) = hardware(name) else {
            found.push(at.problem(
                &format!("hardware[{h}]"),
                format!(
                    "{name:?} is not a known GPU; known: {}",
                    hardware_names().join(", ")
                ),
            ));
            continue;
        };
        if !known_model || checked.contains(&gpu.name) {
            continue;
        }
        checked.push(gpu.name);
        let replica = fleet.replica(h);
        if let Err(e) = replica.engine_config() {
            found.extend(translate(&e, &replica, h, adapters, at));
        }
    }
}

/// The simulator's refusal of one replica, at the config field to change.
/// `None` when the config's own terms have said it already.
fn translate(
    error: &anyhow::Error,
    replica: &sim::ReplicaSpec,
    h: usize,
    adapters: &[String],
    at: &Fields,
) -> Option<config::Problem> {
    use sim::engine::ProfileError;

    let hardware_field = format!("hardware[{h}]");
    Some(match error.downcast_ref::<ProfileError>() {
        Some(ProfileError::InvalidTensorParallel {
            model,
            tensor_parallel,
            reason,
        }) => at.problem(
            "tensorParallel",
            format!(
                "{tensor_parallel} GPUs per replica do not suit {model} ({reason}); {} do",
                or_list(&even_splits(replica))
            ),
        ),
        Some(ProfileError::DoesNotFit {
            model,
            hardware,
            tensor_parallel,
            needed_gb,
            available_gb,
            lora_gb,
            ..
        }) => {
            let loras = match replica.max_loras {
                Some(n) if *lora_gb > 0.0 => {
                    format!(", {lora_gb:.1} GB of it for maxLoras: {n}")
                }
                _ => String::new(),
            };
            at.problem(
                &hardware_field,
                format!(
                    "{model} does not fit on {tensor_parallel} x {hardware}: it needs {needed_gb:.1} GB \
                     per GPU{loras}, and each offers {available_gb:.1} GB; {}",
                    remedies(replica)
                ),
            )
        }
        // The context length is sized to the KV cache with vLLM's default
        // LoRA slots; more slots leave less room than that.
        Some(ProfileError::InvalidSetting {
            field: "max_model_len",
            ..
        }) if replica.max_loras.is_some() => {
            let n = replica.max_loras.unwrap_or_default();
            let (context, left) = context_and_room(replica);
            at.problem(
                "maxLoras",
                format!(
                    "{n} LoRA slots per replica leave {} on {} a KV cache of {left} tokens, \
                     shorter than the {context}-token context the replicas are sized for; {}",
                    replica.model,
                    replica.hardware,
                    remedies(replica)
                ),
            )
        }
        Some(_) => at.problem(
            "",
            format!("the simulator cannot start these replicas: {error:#}"),
        ),
        // Checked in the config's terms before asking the simulator.
        None if !adapters.is_empty() && replica.max_loras == Some(0) => return None,
        None => at.problem(
            "",
            format!("the simulator cannot start these replicas: {error:#}"),
        ),
    })
}

/// Tensor-parallel sizes that split the model's heads evenly.
fn even_splits(replica: &sim::ReplicaSpec) -> Vec<String> {
    (1..=sim::engine::MAX_TENSOR_PARALLEL)
        .filter(|tp| {
            !matches!(
                sim::engine::EngineConfig::new(&replica.hardware, &replica.model, Some(*tp)),
                Err(sim::engine::ProfileError::InvalidTensorParallel { .. })
            )
        })
        .map(|tp| tp.to_string())
        .collect()
}

/// The context length the replica is sized for, and the KV-cache tokens
/// its LoRA slots leave.
fn context_and_room(replica: &sim::ReplicaSpec) -> (u32, u32) {
    match sim::engine::EngineConfig::new(&replica.hardware, &replica.model, replica.tensor_parallel)
    {
        Ok(mut engine) => {
            let context = engine.max_model_len;
            engine.max_loras = replica.max_loras.unwrap_or(engine.max_loras);
            (context, engine.kv_capacity_tokens())
        }
        Err(_) => (0, 0),
    }
}

/// One-setting changes with which the simulator would start `replica`:
/// the most LoRA slots, the fewest GPUs per replica, the GPUs.
fn remedies(replica: &sim::ReplicaSpec) -> String {
    let starts = |changed: sim::ReplicaSpec| changed.engine_config().is_ok();
    let mut remedies = Vec::new();
    if let Some(n) = replica.max_loras
        && let Some(fits) = (0..n).rev().find(|m| {
            starts(sim::ReplicaSpec {
                max_loras: Some(*m),
                ..replica.clone()
            })
        })
    {
        remedies.push(format!("maxLoras: {fits}"));
    }
    if let Some(tp) = (1..=sim::engine::MAX_TENSOR_PARALLEL)
        .filter(|tp| Some(*tp) != replica.tensor_parallel)
        .find(|tp| {
            starts(sim::ReplicaSpec {
                tensor_parallel: Some(*tp),
                ..replica.clone()
            })
        })
    {
        remedies.push(format!("tensorParallel: {tp}"));
    }
    let current = sim::engine::hardware(&replica.hardware).map(|gpu| gpu.name);
    let gpus: Vec<String> = sim::engine::hardware_names()
        .iter()
        .filter(|gpu| Some(**gpu) != current)
        .filter(|gpu| {
            starts(sim::ReplicaSpec {
                hardware: (**gpu).to_owned(),
                ..replica.clone()
            })
        })
        .map(|gpu| (*gpu).to_owned())
        .collect();
    if !gpus.is_empty() {
        remedies.push(format!("hardware {}", or_list(&gpus)));
    }
    match remedies.as_slice() {
        [] => "no single change of maxLoras, tensorParallel or hardware makes it start".to_owned(),
        [one] => format!("it would start with {one}"),
        _ => format!("any one of these would start it: {}", remedies.join("; ")),
    }
}

/// `a, b or c`.
fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG_DOC: &str = include_str!("../../../docs/config.md");

    /// docs/config.md lists the simulator's GPUs and models as the
    /// simulator knows them.
    #[test]
    fn the_config_reference_lists_what_the_simulator_knows() {
        let mut gpus = String::from("| name | hardware |\n|---|---|\n");
        for name in sim::engine::hardware_names() {
            let gpu = sim::engine::hardware(name).unwrap();
            gpus += &format!("| `{name}` | {} |\n", gpu.display_name);
        }
        assert!(
            CONFIG_DOC.contains(&gpus),
            "docs/config.md should have:\n{gpus}"
        );

        let mut models = String::from(
            "| name | Hugging Face id | default `tensorParallel` | context (tokens) |\n|---|---|---|---|\n",
        );
        for name in sim::engine::model_names() {
            let model = sim::engine::model(name).unwrap();
            models += &format!(
                "| `{name}` | `{}` | {} | {} |\n",
                model.hf_id, model.default_tp, model.max_context
            );
        }
        assert!(
            CONFIG_DOC.contains(&models),
            "docs/config.md should have:\n{models}"
        );

        let max_loras = format!(
            "| `maxLoras` | `{}` (vLLM's default) |",
            sim::engine::DEFAULT_MAX_LORAS
        );
        assert!(CONFIG_DOC.contains(&max_loras), "{max_loras}");
        let tp = format!("at most {}", sim::engine::MAX_TENSOR_PARALLEL);
        assert!(CONFIG_DOC.contains(&tp), "{tp}");
        let short = sim::engine::EngineConfig::new("a10g", "llama-3.1-8b", None).unwrap();
        let context = format!(
            "{} tokens for Llama-3.1-8B on one 24 GB card",
            short.max_model_len
        );
        assert!(CONFIG_DOC.contains(&context), "{context}");
    }

    fn pool(simulated: &str, adapters: &str) -> String {
        format!(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]\n  pools:\n    - {{name: p, models: [m], adapters: [{adapters}], simulated: {{{simulated}}}}}\n"
        )
    }

    fn problems_of(yaml: &str) -> Vec<String> {
        match config::from_yaml_with(yaml, problems) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems().iter().map(ToString::to_string).collect(),
        }
    }

    /// Whatever `check` passes, the simulator starts: a valid pool's fleet
    /// validates, and for a refused one the simulator refuses too.
    #[test]
    fn check_and_the_simulator_agree() {
        let cases = [
            (
                "replicas: 2, hardware: [h100, a10g], model: llama-3.1-8b",
                "a",
            ),
            (
                "replicas: 1, hardware: [l4], model: llama-3.1-8b, maxLoras: 1",
                "a",
            ),
            (
                "replicas: 1, hardware: [a10g], model: llama-3.1-70b, tensorParallel: 8",
                "",
            ),
            (
                "replicas: 1, hardware: [h100, b200], model: llama-3.1-8b",
                "",
            ),
            (
                "replicas: 1, hardware: [l4], model: llama-3.1-8b, maxLoras: 2",
                "a",
            ),
            ("replicas: 1, hardware: [l4], model: llama-3.1-70b", ""),
            (
                "replicas: 1, hardware: [h100], model: qwen3-32b, tensorParallel: 3",
                "",
            ),
            (
                "replicas: 1, hardware: [h100], model: llama-3.1-8b, maxLoras: 0",
                "a",
            ),
            (
                "replicas: 1, hardware: [h100], model: llama-3.1-8b, maxLoras: 0",
                "",
            ),
        ];
        for (simulated, adapters) in cases {
            let yaml = pool(simulated, adapters);
            let config = config::from_yaml(&yaml).unwrap();
            let p = &config.spec.pools[0];
            let fleet = fleet_spec(
                p.simulated.as_ref().unwrap(),
                scheduling(p),
                p.base_model(),
                &p.adapters,
            );
            let refused = problems_of(&yaml);
            assert_eq!(
                refused.is_empty(),
                fleet.validate().is_ok(),
                "{simulated}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_pool_that_cannot_be_read_is_left_alone() {
        // `replicas` is reported as unreadable; the simulator is not asked
        // about a fleet of zero replicas.
        let p = problems_of(&pool("replicas: many, hardware: [b200], model: gpt-5", ""));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("spec.pools[0].simulated.replicas: invalid type"),
            "{p:?}"
        );
    }

    #[test]
    fn advice_names_settings_that_work() {
        let p = problems_of(&pool(
            "replicas: 1, hardware: [a10g], model: llama-3.1-70b, tensorParallel: 4",
            "",
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(
                "spec.pools[0].simulated.hardware[0]: llama-3.1-70b does not fit on 4 x NVIDIA A10G"
            ),
            "{p:?}"
        );
        assert!(p[0].contains("tensorParallel: 8"), "{p:?}");
        // And it does start with that.
        assert!(
            problems_of(&pool(
                "replicas: 1, hardware: [a10g], model: llama-3.1-70b, tensorParallel: 8",
                ""
            ))
            .is_empty()
        );

        let p = problems_of(&pool(
            "replicas: 1, hardware: [l4], model: llama-3.1-8b, maxLoras: 3",
            "a",
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("spec.pools[0].simulated.maxLoras: 3 LoRA slots"),
            "{p:?}"
        );
        assert!(p[0].contains("maxLoras: 1;"), "{p:?}");
        assert!(
            !p[0].contains("max_model_len") && !p[0].contains("gpu_memory_utilization"),
            "{p:?}"
        );
    }
}
