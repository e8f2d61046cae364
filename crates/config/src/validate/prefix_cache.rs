//! A pool's `prefixCache`: the ports, endpoints and weights that following
//! the engines' KV-cache events needs.

use crate::problem::Problems;
use crate::schema::PrefixCache;

pub fn check(p: &mut Problems, path: &str, cache: &PrefixCache) {
    for (field, port) in [
        ("eventsPort", cache.events_port),
        ("replayPort", cache.replay_port),
    ] {
        if port == Some(0) {
            p.add(format!("{path}.{field}"), "must be a port, 1 to 65535");
        }
    }
    if cache.data_parallel_size == Some(0) {
        p.add(format!("{path}.dataParallelSize"), "must be at least 1");
    }
    if let Some(weight) = cache.offload_weight
        && !(0.0..=1.0).contains(&weight)
    {
        p.add(
            format!("{path}.offloadWeight"),
            "must be a number from 0 to 1",
        );
    }
    if cache
        .tokenize_path
        .as_deref()
        .is_some_and(|t| !t.starts_with('/'))
    {
        p.add(format!("{path}.tokenizePath"), "must start with /");
    }
    if cache.tokenize_timeout.is_some_and(|t| t.is_zero()) {
        p.add(format!("{path}.tokenizeTimeout"), "must be more than 0");
    }
    for (replica, publisher) in &cache.publishers {
        let at = format!("{path}.publishers[{replica:?}]");
        check_zmq_endpoint(p, &format!("{at}.endpoint"), &publisher.endpoint);
        if let Some(replay) = &publisher.replay_endpoint {
            check_zmq_endpoint(p, &format!("{at}.replayEndpoint"), replay);
        }
    }
}

/// `tcp://host:port`, the only transport a publisher on another host can
/// be reached by.
fn check_zmq_endpoint(p: &mut Problems, path: &str, endpoint: &str) {
    let port = endpoint
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .filter(|(host, _)| !host.is_empty())
        .and_then(|(_, port)| port.parse::<u16>().ok());
    if !matches!(port, Some(1..)) {
        p.add(path, format!("{endpoint:?} is not tcp://host:port"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Publisher;

    fn problems(cache: &PrefixCache) -> Vec<String> {
        let mut p = Problems(Vec::new());
        check(&mut p, "spec.pools[0].prefixCache", cache);
        p.0.into_iter().map(|problem| problem.to_string()).collect()
    }

    #[test]
    fn the_default_and_a_full_events_source_pass() {
        assert!(problems(&PrefixCache::default()).is_empty());
        let mut cache = PrefixCache {
            source: crate::schema::PrefixSource::Events,
            events_port: Some(5557),
            replay_port: Some(5558),
            data_parallel_size: Some(2),
            offload_weight: Some(0.25),
            tokenize_path: Some("/tokenize".into()),
            ..PrefixCache::default()
        };
        cache.publishers.insert(
            "127.0.0.1:8001".into(),
            Publisher {
                endpoint: "tcp://127.0.0.1:6001".into(),
                replay_endpoint: Some("tcp://127.0.0.1:6002".into()),
            },
        );
        assert!(problems(&cache).is_empty(), "{:?}", problems(&cache));
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut cache = PrefixCache {
            events_port: Some(0),
            replay_port: Some(0),
            data_parallel_size: Some(0),
            offload_weight: Some(f64::NAN),
            tokenize_path: Some("tokenize".into()),
            tokenize_timeout: Some(std::time::Duration::ZERO),
            ..PrefixCache::default()
        };
        cache.publishers.insert(
            "a:1".into(),
            Publisher {
                endpoint: "ipc:///tmp/x".into(),
                replay_endpoint: Some("tcp://:5".into()),
            },
        );
        let found = problems(&cache).join("\n");
        for field in [
            "eventsPort",
            "replayPort",
            "dataParallelSize",
            "offloadWeight",
            "tokenizePath",
            "tokenizeTimeout",
            "publishers[\"a:1\"].endpoint",
            "publishers[\"a:1\"].replayEndpoint",
        ] {
            assert!(
                found.contains(&format!("prefixCache.{field}")),
                "{field} not named in:\n{found}"
            );
        }
    }

    #[test]
    fn a_replica_publishes_on_its_host_unless_listed() {
        let mut cache = PrefixCache {
            replay_port: Some(5558),
            ..PrefixCache::default()
        };
        let at = cache.publisher_of("https://10.0.0.7:8000");
        assert_eq!(at.endpoint, "tcp://10.0.0.7:5557");
        assert_eq!(at.replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5558"));
        let listed = Publisher {
            endpoint: "tcp://127.0.0.1:7001".into(),
            replay_endpoint: None,
        };
        cache
            .publishers
            .insert("127.0.0.1:9000".into(), listed.clone());
        assert_eq!(cache.publisher_of("127.0.0.1:9000"), listed);
    }
}
