//! The block index: stores, removals, clears, chains, adapters, tiers, and
//! many replicas asked at once.

use kv_events::index::{BlockMatch, PoolIndex, PublisherId, PublisherIndex, Source, Tier, Unsure};
use kv_events::keys::prompt_keys;
use kv_events::wire::{
    BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent, MEDIUM_GPU, Value,
};

const BS: u32 = 4;

/// A prompt of `blocks` full blocks whose tokens start at `first`.
fn tokens(first: u32, blocks: u32) -> Vec<u32> {
    (first..first + blocks * BS).collect()
}

fn id(replica: u64) -> PublisherId {
    PublisherId { replica, rank: 0 }
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events,
        data_parallel_rank: None,
    }
}

/// Store `tokens` as blocks hashed `hashes`, after `parent`.
fn store(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> BlockStored {
    BlockStored::new(
        hashes.iter().map(|&h| BlockHash::Unsigned(h)).collect(),
        parent.map(BlockHash::Unsigned),
        tokens.to_vec(),
        BS,
        None,
    )
}

fn stored(e: BlockStored) -> KvEvent {
    KvEvent::BlockStored(e)
}

fn removed(hashes: &[u64], medium: &str) -> KvEvent {
    KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes.iter().map(|&h| BlockHash::Unsigned(h)).collect(),
        medium: Some(medium.to_owned()),
        group_idx: None,
    })
}

fn gpu(n: u32) -> BlockMatch {
    BlockMatch { gpu: n, offload: 0 }
}

fn apply(p: &PublisherIndex, seq: u64, events: Vec<KvEvent>) {
    p.apply(seq, &batch(events));
}

#[test]
fn stores_chain_across_events_and_a_prompt_matches_its_longest_prefix() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 5);
    apply(&p, 0, vec![stored(store(&[11, 12, 13], None, &t[..12]))]);
    apply(&p, 1, vec![stored(store(&[14, 15], Some(13), &t[12..20]))]);

    let mut prompt = t.clone();
    prompt.extend([7, 7]); // a partial block is never matched
    assert_eq!(p.matched_blocks(&prompt, None, BS), gpu(5));
    let mut other = t[..12].to_vec();
    other.extend(tokens(900, 2));
    assert_eq!(p.matched_blocks(&other, None, BS), gpu(3));
    assert_eq!(p.matched_blocks(&tokens(500, 3), None, BS), gpu(0));
    // The same tokens at another block size are other blocks.
    assert_eq!(p.matched_blocks(&t, None, 2), gpu(0));

    let status = p.status().unwrap();
    assert_eq!(status.gpu_blocks, 5);
    assert_eq!(status.block_size, Some(BS));
    assert_eq!(pool.block_size(), Some(BS));
    assert_eq!(status.last_sequence, Some(1));
    assert_eq!(status.batches, 2);
    assert_eq!(status.events, 2);
}

#[test]
fn a_removed_block_ends_the_match_there() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 4);
    apply(&p, 0, vec![stored(store(&[1, 2, 3, 4], None, &t))]);
    apply(&p, 1, vec![removed(&[3], MEDIUM_GPU)]);
    assert_eq!(p.matched_blocks(&t, None, BS), gpu(2));
    // Removing what is not there is counted, and changes nothing.
    apply(&p, 2, vec![removed(&[3, 99], MEDIUM_GPU)]);
    let status = p.status().unwrap();
    assert_eq!(status.missing_removals, 2);
    assert_eq!(status.gpu_blocks, 3);
    assert_eq!((status.stored_blocks, status.removed_blocks), (4, 1));
    assert_eq!(pool.block_ids(id(1), Tier::Gpu), [1, 2, 4]);
}

#[test]
fn all_blocks_cleared_empties_it_and_makes_it_exact_again() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 2);
    apply(&p, 0, vec![stored(store(&[1, 2], None, &t))]);
    p.set_source(Source::Unsure(Unsure::Gap));
    assert!(!pool.is_exact(1));
    apply(
        &p,
        1,
        vec![
            KvEvent::AllBlocksCleared,
            stored(store(&[5], None, &t[..4])),
        ],
    );
    assert_eq!(p.matched_blocks(&t, None, BS), gpu(1));
    assert_eq!(p.status().unwrap().source, Source::Events);
    assert!(pool.is_exact(1));
    assert_eq!(pool.block_ids(id(1), Tier::Gpu), [5]);
}

#[test]
fn a_restart_forgets_blocks_and_sequence() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    apply(&p, 7, vec![stored(store(&[1], None, &tokens(0, 1)))]);
    p.restart();
    let status = p.status().unwrap();
    assert_eq!(status.blocks(), 0);
    assert_eq!(status.last_sequence, None);
    assert_eq!(status.restarts, 1);
    assert_eq!(pool.distinct_blocks(), 0);
}

#[test]
fn adapters_have_their_own_blocks() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 2);
    let mut lora = store(&[1, 2], None, &t);
    lora.lora_name = Some("sql-lora".into());
    apply(&p, 0, vec![stored(lora)]);
    assert_eq!(p.matched_blocks(&t, None, BS), gpu(0));
    assert_eq!(p.matched_blocks(&t, Some("chat-lora"), BS), gpu(0));
    assert_eq!(p.matched_blocks(&t, Some("sql-lora"), BS), gpu(2));
    // A child store names only its parent: it inherits the adapter.
    let mut child = store(&[3], Some(2), &tokens(50, 1));
    child.lora_name = Some("sql-lora".into());
    apply(&p, 1, vec![stored(child)]);
    let mut longer = t.clone();
    longer.extend(tokens(50, 1));
    assert_eq!(p.matched_blocks(&longer, Some("sql-lora"), BS), gpu(3));
}

#[test]
fn an_offloaded_tier_continues_the_gpu_run() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 4);
    apply(&p, 0, vec![stored(store(&[1, 2], None, &t[..8]))]);
    let mut offloaded = store(&[3, 4], Some(2), &t[8..]);
    offloaded.medium = Some("CPU".into());
    apply(&p, 1, vec![stored(offloaded)]);
    assert_eq!(
        p.matched_blocks(&t, None, BS),
        BlockMatch { gpu: 2, offload: 2 }
    );

    // Block 1 also offloaded, then evicted from the GPU: the GPU run is
    // empty and the offload run covers blocks 1..4.
    let mut both = store(&[1, 2], None, &t[..8]);
    both.medium = Some("cpu".into());
    apply(&p, 2, vec![stored(both), removed(&[1], MEDIUM_GPU)]);
    assert_eq!(
        p.matched_blocks(&t, None, BS),
        BlockMatch { gpu: 0, offload: 4 }
    );
    let status = p.status().unwrap();
    assert_eq!((status.gpu_blocks, status.offload_blocks), (1, 4));
    assert_eq!(pool.block_ids(id(1), Tier::Offload), [1, 2, 3, 4]);

    // An offload run ends at a block found only on the GPU.
    apply(&p, 3, vec![removed(&[3], "CPU")]);
    assert_eq!(
        p.matched_blocks(&t, None, BS),
        BlockMatch { gpu: 0, offload: 2 }
    );
    let m = BlockMatch { gpu: 2, offload: 2 };
    assert_eq!(m.share(4, 0.5), 0.75);
    assert_eq!(m.total(), 4);
}

#[test]
fn one_walk_answers_for_every_replica_and_rank() {
    let pool = PoolIndex::new();
    let system = tokens(0, 3);
    let mut conversation = system.clone();
    conversation.extend(tokens(1000, 2));

    // Replica 1 and 2 hold the system prompt; replica 2's rank 1 holds
    // the conversation; replica 3 holds something else.
    let r1 = pool.attach(id(1));
    let r2 = pool.attach(id(2));
    let r2b = pool.attach(PublisherId {
        replica: 2,
        rank: 1,
    });
    let r3 = pool.attach(id(3));
    apply(&r1, 0, vec![stored(store(&[1, 2, 3], None, &system))]);
    // Engine hashes are per engine: another replica may hash differently.
    apply(&r2, 0, vec![stored(store(&[71, 72, 73], None, &system))]);
    apply(
        &r2b,
        0,
        vec![stored(store(&[1, 2, 3, 4, 5], None, &conversation))],
    );
    apply(&r3, 0, vec![stored(store(&[1], None, &tokens(77, 1)))]);

    let keys = prompt_keys(&conversation, None, BS);
    let matches = pool.match_prefix(&keys);
    assert_eq!(matches.prompt_blocks(), 5);
    assert_eq!(matches.get(1), gpu(3));
    assert_eq!(matches.get(2), gpu(5), "the best rank");
    assert_eq!(matches.get(3), gpu(0));
    assert_eq!(matches.get(4), gpu(0), "unknown replica");
    let ids: Vec<_> = matches.iter().map(|(id, _)| id).collect();
    assert_eq!(
        ids,
        [
            id(1),
            id(2),
            PublisherId {
                replica: 2,
                rank: 1
            }
        ]
    );
    assert_eq!(
        pool.matched_blocks(2, &conversation, None, BS),
        matches.get(2)
    );
    // Shares only where the index is exact (here: nowhere yet).
    assert_eq!(matches.exact_share(1, 0.5), None);
    for p in [&r1, &r2, &r2b] {
        p.set_source(Source::Events);
    }
    let matches = pool.match_prefix(&keys);
    assert_eq!(matches.exact_share(1, 0.5), Some(3.0 / 5.0));
    assert_eq!(matches.exact_share(2, 0.5), Some(1.0));
    assert_eq!(matches.exact_share(3, 0.5), None, "not exact");
    assert_eq!(matches.exact_share(4, 0.5), None, "no publisher");
    r2b.set_source(Source::Unsure(Unsure::Gap));
    assert_eq!(
        pool.match_prefix(&keys).exact_share(2, 0.5),
        None,
        "one rank unsure"
    );
    assert_eq!(pool.replica_status(2).len(), 2);
}

#[test]
fn a_child_of_a_block_removed_a_moment_ago_is_still_keyed() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 2);
    apply(&p, 0, vec![stored(store(&[1], None, &t[..4]))]);
    apply(&p, 1, vec![removed(&[1], MEDIUM_GPU)]);
    apply(&p, 2, vec![stored(store(&[2], Some(1), &t[4..]))]);
    assert_eq!(p.status().unwrap().orphaned_blocks, 0);
    assert_eq!(pool.block_ids(id(1), Tier::Gpu), [2]);
    // The prefix needs its first block, which is gone.
    assert_eq!(p.matched_blocks(&t, None, BS), gpu(0));
    apply(&p, 3, vec![stored(store(&[1], None, &t[..4]))]);
    assert_eq!(p.matched_blocks(&t, None, BS), gpu(2));
}

#[test]
fn a_store_without_its_parent_is_orphaned() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    apply(&p, 0, vec![stored(store(&[5, 6], Some(4), &tokens(0, 2)))]);
    let status = p.status().unwrap();
    assert_eq!(status.orphaned_blocks, 2);
    assert_eq!(status.blocks(), 0);
}

#[test]
fn a_block_stored_under_two_hashes_stays_until_both_are_removed() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 1);
    apply(
        &p,
        0,
        vec![
            stored(store(&[1], None, &t)),
            stored(store(&[2], None, &t)),
            // Stored again: nothing changes.
            stored(store(&[1], None, &t)),
        ],
    );
    apply(&p, 1, vec![removed(&[1], MEDIUM_GPU)]);
    assert_eq!(p.matched_blocks(&t, None, BS), gpu(1));
    apply(&p, 2, vec![removed(&[2], MEDIUM_GPU)]);
    assert_eq!(p.matched_blocks(&t, None, BS), gpu(0));
    assert_eq!(pool.distinct_blocks(), 0);
}

#[test]
fn a_hash_reused_for_other_tokens_moves_the_block() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    apply(&p, 0, vec![stored(store(&[1], None, &tokens(0, 1)))]);
    apply(&p, 1, vec![stored(store(&[1], None, &tokens(50, 1)))]);
    assert_eq!(p.matched_blocks(&tokens(0, 1), None, BS), gpu(0));
    assert_eq!(p.matched_blocks(&tokens(50, 1), None, BS), gpu(1));
    assert_eq!(p.status().unwrap().gpu_blocks, 1);
    assert_eq!(pool.distinct_blocks(), 1);
}

#[test]
fn bytes_and_integer_hashes_name_blocks_alike() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 2);
    let sha = |b: u8| BlockHash::Bytes(vec![b; 32]);
    let mut s = store(&[], None, &t);
    s.block_hashes = vec![sha(1), sha(2)];
    apply(&p, 0, vec![stored(s)]);
    let mut child = store(&[], None, &tokens(9, 1));
    child.block_hashes = vec![BlockHash::Signed(-3)];
    child.parent_block_hash = Some(sha(2));
    apply(&p, 1, vec![stored(child)]);
    let mut prompt = t.clone();
    prompt.extend(tokens(9, 1));
    assert_eq!(p.matched_blocks(&prompt, None, BS), gpu(3));
    let removal = KvEvent::BlockRemoved(BlockRemoved::new(vec![sha(2), BlockHash::Signed(-3)]));
    apply(&p, 2, vec![removal]);
    assert_eq!(p.matched_blocks(&prompt, None, BS), gpu(1));
}

#[test]
fn unknown_kinds_other_groups_and_bad_stores_are_counted_and_ignored() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 1);
    let mut other_group = store(&[1], None, &t);
    other_group.group_idx = Some(1);
    let mut first_group = store(&[2], None, &t);
    first_group.group_idx = Some(0);
    let short = store(&[3, 4], None, &t);
    apply(
        &p,
        0,
        vec![
            KvEvent::Unknown {
                kind: "BlocksMoved".into(),
            },
            stored(other_group),
            stored(first_group),
            stored(short),
        ],
    );
    let status = p.status().unwrap();
    assert_eq!(status.unknown_events, 1);
    assert_eq!(status.skipped_events, 2);
    assert_eq!(status.events, 4);
    assert_eq!(pool.block_ids(id(1), Tier::Gpu), [2]);
}

#[test]
fn extra_keys_beyond_the_adapter_make_a_block_unmatchable() {
    let pool = PoolIndex::new();
    let p = pool.attach(id(1));
    let t = tokens(0, 2);
    let mut s = store(&[1, 2], None, &t);
    s.lora_name = Some("sql".into());
    s.extra_keys = Some(vec![
        Some(Value::Array(vec![Value::from("sql")])),
        Some(Value::Array(vec![Value::from("sql"), Value::from("img-1")])),
    ]);
    apply(&p, 0, vec![stored(s)]);
    assert_eq!(p.matched_blocks(&t, Some("sql"), BS), gpu(1));
}

#[test]
fn dropping_the_writer_forgets_the_publisher() {
    let pool = PoolIndex::new();
    let t = tokens(0, 1);
    let p = pool.attach(id(1));
    apply(&p, 0, vec![stored(store(&[1], None, &t))]);
    let again = pool.attach(id(1));
    // The first handle was replaced: its writes go nowhere.
    apply(&p, 1, vec![stored(store(&[2], None, &t))]);
    assert_eq!(pool.matched_blocks(1, &t, None, BS), gpu(0));
    assert!(p.status().is_none());
    apply(&again, 0, vec![stored(store(&[3], None, &t))]);
    assert_eq!(pool.matched_blocks(1, &t, None, BS), gpu(1));
    drop(p);
    assert_eq!(pool.matched_blocks(1, &t, None, BS), gpu(1));
    drop(again);
    assert_eq!(pool.matched_blocks(1, &t, None, BS), gpu(0));
    assert!(pool.statuses().is_empty());
    assert_eq!(pool.distinct_blocks(), 0);
}
