//! Routing on the engines' own KV-cache events instead of a guess.
//!
//! vLLM (`--kv-events-config`) and SGLang publish, on a ZMQ PUB socket,
//! every block their prefix cache stores or evicts. This crate reads that
//! stream and keeps an exact index of what each replica holds, so the
//! picker can ask how much of a prompt each candidate already has.
//!
//! - [`wire`]: the message format (both of vLLM's msgpack encodings),
//!   decoding with typed errors, and an encoder for simulators and tests.
//! - [`keys`]: our own chained block keys, from token ids; engines' hashes
//!   are not reproducible outside the engine.
//! - [`index`]: one [`PoolIndex`](index::PoolIndex) per pool: a shared map
//!   from block key to the replicas holding it, plus per replica the
//!   engine-hash → key map and the stream's status. Its docs explain why
//!   this shape.
//! - [`subscriber`]: a task per replica rank that follows its publisher
//!   into the index, filling gaps from the replay socket and noticing
//!   restarts.
//! - [`publisher`]: the publishing side (PUB plus replay ROUTER), for the
//!   simulator and tests.
//! - [`tokenizer`]: the simulator's tokenizer, whose token ids a simulated
//!   replica's events carry.
//!
//! ZeroMQ comes from the pure-Rust `zeromq` crate: no libzmq to install.
//!
//! # Using it from the gateway
//!
//! 1. One [`PoolIndex::new`](index::PoolIndex::new) per pool, kept with
//!    what outlives a config generation (the pool's runtime).
//! 2. Per replica whose engine publishes events,
//!    [`subscribe`](subscriber::subscribe)`(&index, replica_id, config)`
//!    with the replica's `tcp://host:port` (and replay port, topic,
//!    data-parallel size) in a [`SubscriberConfig`](subscriber::SubscriberConfig);
//!    keep the [`Subscription`](subscriber::Subscription) with the replica
//!    and drop it when the replica leaves: its blocks leave the index.
//! 3. Per request: the prompt's token ids as the engine sees them (for the
//!    simulator, [`tokenizer::encode_chat`] or [`tokenizer::encode_prompt`],
//!    or the replica's own `POST /tokenize`),
//!    [`keys::prompt_keys`]`(&tokens, adapter, block_size)` with the
//!    engines' block size (vLLM's default 16; each status reports the one
//!    its engine uses), then [`PoolIndex::match_prefix`](index::PoolIndex::match_prefix)
//!    once for all candidates. For each candidate,
//!    [`PrefixMatches::exact_share`](index::PrefixMatches::exact_share)
//!    `(replica_id, offload_weight)` is its share of the prompt, or `None`
//!    where the events cannot speak for it (no publisher, a gap not
//!    replayed, a restart not yet seen through): the picker's
//!    `ExactPrefix::shares`, replica by replica.
//! 4. [`PoolIndex::statuses`](index::PoolIndex::statuses) for debug pages:
//!    source (events or unsure, and why), blocks, last sequence, gaps,
//!    replays, events, unknown events.
//!
//! # Cost
//!
//! `cargo bench -p kv-events --bench index`, on the 2-core development
//! machine, for an 8k-token prompt whose 2k-token system prompt every
//! replica holds (16 other conversations each, the previous turn on one):
//! hashing the prompt into keys 11 µs; matching it against every replica
//! 6 µs (8 replicas), 16 µs (64), 44 µs (256) — the walk visits each
//! holder of each matched block once, so a prefix every replica holds
//! costs in proportion to the pool; applying an engine step of 16 stores
//! and 16 removals 2.7 µs.
pub mod index;
pub mod keys;
pub mod publisher;
pub mod subscriber;
pub mod tokenizer;
pub mod wire;
