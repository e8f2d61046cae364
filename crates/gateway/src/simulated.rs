//! Pools whose replicas are simulated: started in-process on free local
//! ports when the gateway starts, stopped when it stops.

pub use sim::Fleet;

pub async fn start(pool: &config::Pool, spec: &config::Simulated) -> anyhow::Result<Fleet> {
    let fleet = sim::FleetSpec {
        replicas: spec.replicas,
        hardware: spec.hardware.clone(),
        model: spec.model.clone(),
        served_model_name: Some(pool.base_model().to_owned()),
        tensor_parallel: spec.tensor_parallel,
        adapters: pool.adapters.clone(),
        max_loras: spec.max_loras,
        time_scale: spec.time_scale.unwrap_or(config::defaults::SIM_TIME_SCALE),
        seed: spec.seed.unwrap_or_default(),
        ..sim::FleetSpec::default()
    };
    sim::start_fleet(fleet).await.map_err(|e| {
        anyhow::anyhow!(
            "pool {:?}: cannot start simulated replicas: {e:#}",
            pool.name
        )
    })
}

pub fn addrs(fleet: &Fleet) -> Vec<String> {
    fleet.addrs().iter().map(ToString::to_string).collect()
}
