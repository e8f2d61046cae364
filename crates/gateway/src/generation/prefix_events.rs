//! A pool that scores prefix affinity on its engines' own KV-cache events
//! (`prefixCache.source: events`).
//!
//! Every replica's publisher is followed into one exact block index per
//! pool (the `kv-events` crate), subscribed to as replicas join and
//! dropped as they leave, so every gateway replica subscribed to the same
//! engines holds the same index and makes the same prefix choice. A
//! request's prompt is matched against it by token ids as the engine sees
//! them: the engine's own tokenizer endpoint (vLLM's `POST /tokenize`)
//! renders the chat template and tokenizes, so the ids are exact for any
//! model without a tokenizer file or template in the gateway, at the cost
//! of one round trip to a replica's API server. Anything that stops a
//! match (no replica answers in time, a prompt shorter than a block, no
//! event heard yet) leaves the request to the approximate index, and one
//! unsure replica leaves only itself to it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use kv_events::index::{PoolIndex, PrefixMatches};
use kv_events::subscriber::{self, SubscriberConfig, Subscription};
use picker::{Endpoint, ExactPrefix};
use serde_json::{Map, Value};

/// What a request needs to be matched: the pool's index and how to ask a
/// replica for a prompt's tokens; swapped whole when a generation changes
/// it.
pub struct EventsSource {
    index: Arc<PoolIndex>,
    settings: config::PrefixCache,
    client: reqwest::Client,
    /// Which replica tokenizes next: turns spread the work.
    next: AtomicUsize,
    unmatched: Unmatched,
}

/// Why a request's prompt was not matched, counted
/// (`infergate_prefix_unmatched_total`).
#[derive(Clone, Copy)]
enum Why {
    /// No replica has published a stored block yet.
    NoEvents,
    /// Shorter than one block.
    ShortPrompt,
    /// A body with no messages or text prompt to tokenize.
    NoPrompt,
    /// No reachable replica, or none tokenized it in time.
    NotTokenized,
}

impl Why {
    const ALL: [Why; 4] = [
        Why::NoEvents,
        Why::ShortPrompt,
        Why::NoPrompt,
        Why::NotTokenized,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Why::NoEvents => "no-events",
            Why::ShortPrompt => "short-prompt",
            Why::NoPrompt => "no-prompt",
            Why::NotTokenized => "not-tokenized",
        }
    }
}

/// One counter per [`Why`], in its order.
struct Unmatched([prometheus_client::metrics::counter::Counter; 4]);

impl Unmatched {
    fn count(&self, why: Why) -> Option<Arc<dyn ExactPrefix>> {
        self.0[why as usize].inc();
        None
    }
}

impl EventsSource {
    pub fn new(
        index: Arc<PoolIndex>,
        settings: config::PrefixCache,
        pool: &str,
        metrics: &crate::telemetry::Metrics,
    ) -> Self {
        let client = reqwest::Client::builder()
            .timeout(settings.tokenize_timeout())
            .build()
            .unwrap_or_default();
        Self {
            index,
            settings,
            client,
            next: AtomicUsize::new(0),
            unmatched: Unmatched(Why::ALL.map(|why| metrics.prefix_unmatched(pool, why.as_str()))),
        }
    }

    /// What each replica holds of the request's prompt, or `None` when the
    /// prompt cannot be matched now (the guess scores it).
    pub async fn match_request(
        &self,
        body: &Bytes,
        adapter: Option<&str>,
        estimated_prompt_tokens: u64,
        replicas: &[Arc<Endpoint>],
    ) -> Option<Arc<dyn ExactPrefix>> {
        // Nothing stored yet, nowhere to match; a prompt of less than a
        // block has no block to find.
        let Some(block_size) = self.index.block_size() else {
            return self.unmatched.count(Why::NoEvents);
        };
        if estimated_prompt_tokens < u64::from(block_size) {
            return self.unmatched.count(Why::ShortPrompt);
        }
        let Some(request) = tokenize_request(body) else {
            return self.unmatched.count(Why::NoPrompt);
        };
        let Some(tokens) = self.tokenize(&request, replicas).await else {
            return self.unmatched.count(Why::NotTokenized);
        };
        let keys = kv_events::keys::prompt_keys(&tokens, adapter, block_size);
        if keys.is_empty() {
            return self.unmatched.count(Why::ShortPrompt);
        }
        Some(Arc::new(EventMatches {
            matches: self.index.match_prefix(&keys),
            offload_weight: self.settings.offload_weight(),
        }))
    }

    /// The prompt's token ids from one reachable replica's tokenizer
    /// endpoint, the replicas taking turns.
    async fn tokenize(&self, request: &Value, replicas: &[Arc<Endpoint>]) -> Option<Vec<u32>> {
        let reachable: Vec<&Arc<Endpoint>> = replicas.iter().filter(|e| e.is_reachable()).collect();
        if reachable.is_empty() {
            return None;
        }
        let replica = reachable[self.next.fetch_add(1, Ordering::Relaxed) % reachable.len()];
        let url = replica_url(&replica.addr, self.settings.tokenize_path());
        let answer = self.client.post(url).json(request).send().await;
        let tokens = match answer {
            Ok(answer) if answer.status().is_success() => answer.json::<Tokenized>().await,
            Ok(answer) => {
                tracing::debug!(replica = %replica.addr, status = %answer.status(),
                    "the replica did not tokenize the prompt; the guess scores its prefix");
                return None;
            }
            Err(e) => {
                tracing::debug!(replica = %replica.addr, error = %e,
                    "tokenizing the prompt failed; the guess scores its prefix");
                return None;
            }
        };
        tokens.ok().map(|t| t.tokens)
    }
}

/// The answer of vLLM's `/tokenize`.
#[derive(serde::Deserialize)]
struct Tokenized {
    tokens: Vec<u32>,
}

/// The body of a tokenize request for an inference body: its model and
/// its messages (with the generation prompt the engine will add) or its
/// prompt, as vLLM's `/tokenize` takes them. `None` for a body that has
/// neither (embeddings of many inputs, say).
fn tokenize_request(body: &[u8]) -> Option<Value> {
    let Value::Object(body) = serde_json::from_slice::<Value>(body).ok()? else {
        return None;
    };
    let mut request = Map::new();
    request.insert("model".into(), body.get("model")?.clone());
    if let Some(messages) = body.get("messages") {
        request.insert("messages".into(), messages.clone());
        request.insert("add_generation_prompt".into(), Value::Bool(true));
    } else if let Some(prompt @ Value::String(_)) = body.get("prompt") {
        request.insert("prompt".into(), prompt.clone());
    } else {
        return None;
    }
    Some(Value::Object(request))
}

fn replica_url(addr: &str, path: &str) -> String {
    if addr.starts_with("https://") || addr.starts_with("http://") {
        format!("{addr}{path}")
    } else {
        format!("http://{addr}{path}")
    }
}

/// One request's matches, as the picker reads them.
#[derive(Debug)]
struct EventMatches {
    matches: PrefixMatches,
    offload_weight: f64,
}

impl ExactPrefix for EventMatches {
    fn shares(&self, endpoints: &[usize], out: &mut [Option<f64>]) {
        for (share, &index) in out.iter_mut().zip(endpoints) {
            *share = self.matches.exact_share(index as u64, self.offload_weight);
        }
    }
}

/// The subscriptions of a pool's replicas, kept with its membership.
#[derive(Default)]
pub struct Subscriptions {
    /// The settings they were made under; all are made again when these
    /// change.
    settings: Option<config::PrefixCache>,
    by_addr: HashMap<Arc<str>, Subscription>,
}

impl Subscriptions {
    /// Follow exactly `replicas` under `settings` (none when the pool
    /// guesses): newcomers are subscribed to, leavers dropped (their
    /// blocks leave the index).
    pub fn reconcile(
        &mut self,
        index: &Arc<PoolIndex>,
        settings: Option<&config::PrefixCache>,
        replicas: &[Arc<Endpoint>],
    ) {
        if self.settings.as_ref() != settings {
            self.by_addr.clear();
            self.settings = settings.cloned();
        }
        let Some(settings) = settings else {
            return;
        };
        self.by_addr
            .retain(|addr, _| replicas.iter().any(|e| e.addr == *addr));
        for replica in replicas {
            if self.by_addr.contains_key(&replica.addr) {
                continue;
            }
            let publisher = settings.publisher_of(&replica.addr);
            let config = SubscriberConfig {
                replay_endpoint: publisher.replay_endpoint,
                topic: settings.topic.clone().unwrap_or_default(),
                data_parallel_size: settings.data_parallel_size(),
                ..SubscriberConfig::new(publisher.endpoint)
            };
            match subscriber::subscribe(index, replica.index as u64, config) {
                Ok(subscription) => {
                    self.by_addr.insert(Arc::clone(&replica.addr), subscription);
                }
                Err(e) => tracing::warn!(replica = %replica.addr, error = %e,
                    "cannot follow the replica's KV-cache events; its prefix is guessed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_body_is_tokenized_with_its_generation_prompt_and_a_completion_by_its_prompt() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
        assert_eq!(
            tokenize_request(chat).unwrap(),
            serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "add_generation_prompt": true,
            })
        );
        let completion = br#"{"model":"m","prompt":"once upon","stream":true}"#;
        assert_eq!(
            tokenize_request(completion).unwrap(),
            serde_json::json!({"model": "m", "prompt": "once upon"})
        );
        for unmatched in [
            &br#"{"model":"m","input":["a","b"]}"#[..],
            br#"{"model":"m","prompt":["a","b"]}"#,
            br#"{"messages":[]}"#,
            b"not json",
        ] {
            assert_eq!(tokenize_request(unmatched), None);
        }
    }

    #[test]
    fn replicas_are_reached_over_their_own_scheme() {
        assert_eq!(
            replica_url("10.0.0.1:8000", "/tokenize"),
            "http://10.0.0.1:8000/tokenize"
        );
        assert_eq!(
            replica_url("https://r.example:443", "/tokenize"),
            "https://r.example:443/tokenize"
        );
    }
}
