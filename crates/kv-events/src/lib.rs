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
pub mod index;
pub mod keys;
pub mod publisher;
pub mod subscriber;
pub mod tokenizer;
pub mod wire;
