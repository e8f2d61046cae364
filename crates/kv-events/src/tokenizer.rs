//! The simulator's tokenizer: deterministic and approximate.
//!
//! The simulator needs token counts that behave like a real tokenizer's (about
//! four bytes of English per token) and token ids that are stable, so that the
//! engine's prefix cache sees the same ids for the same text. It does not need
//! a real vocabulary, so this is a cheap stand-in, not BPE.
//!
//! It lives here, not in the simulator, because a simulated replica's KV
//! events carry these ids: a gateway indexing them tokenizes prompts with the
//! same functions (the simulator re-exports this module as `sim::tokenizer`).
//!
//! How it works:
//!
//! 1. **Pre-tokenize** like GPT-style tokenizers: a *word* is an optional single
//!    leading space followed by a run of alphanumeric characters; any other
//!    non-whitespace character is a piece of its own; a run of whitespace is one
//!    piece, except that a single space directly before a word joins the word.
//! 2. **Split long pieces**: a piece of up to [`MAX_WHOLE_PIECE_BYTES`] bytes is
//!    one token (common words are single tokens in real vocabularies); a longer
//!    piece is cut into chunks of at most [`CHUNK_BYTES`] bytes, at character
//!    boundaries.
//! 3. **Id** = xxh3 hash of the piece's bytes modulo [`VOCAB_SIZE`] (Llama 3's
//!    vocabulary size), so the same piece always gets the same id.
//!
//! Pieces depend only on nearby text, so two prompts that share a prefix share
//! their leading token ids (all but possibly the last piece of the shared part).

use xxhash_rust::xxh3::xxh3_64;

/// Size of the simulated vocabulary (Llama 3's regular tokens).
pub const VOCAB_SIZE: u32 = 128_000;
/// A piece up to this many bytes (leading space included) is a single token.
pub const MAX_WHOLE_PIECE_BYTES: usize = 8;
/// Longer pieces are split into chunks of at most this many bytes.
pub const CHUNK_BYTES: usize = 4;

/// Special token ids, placed above the regular vocabulary as Llama 3 does.
pub mod special {
    pub const BEGIN_OF_TEXT: u32 = 128_000;
    pub const START_HEADER: u32 = 128_006;
    pub const END_HEADER: u32 = 128_007;
    pub const END_OF_TURN: u32 = 128_009;
}

/// Encodes `text` into token ids (no special tokens added).
pub fn encode(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len() / 4 + 1);
    encode_into(text, &mut ids);
    ids
}

/// Counts the tokens of `text` without allocating the ids.
pub fn count(text: &str) -> usize {
    let mut n = 0;
    for_each_piece(text, |piece| n += pieces_in(piece).count());
    n
}

/// Appends the token ids of `text` to `out`.
pub fn encode_into(text: &str, out: &mut Vec<u32>) {
    for_each_piece(text, |piece| {
        out.extend(pieces_in(piece).map(|p| token_id(p.as_bytes())));
    });
}

/// One message of a chat conversation, as the chat template sees it.
#[derive(Debug, Clone, Copy)]
pub struct ChatTurn<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

/// Encodes a conversation with a Llama-3-style chat template:
/// `<|begin_of_text|>` then, per message, `<|start_header_id|>role<|end_header_id|>\n\n
/// content<|eot_id|>`, then the assistant header that asks for a reply.
/// The template's overhead (about five tokens per message) is what real chat
/// prompts pay too, and the fixed layout keeps shared conversation prefixes
/// token-identical.
pub fn encode_chat<'a>(turns: impl IntoIterator<Item = ChatTurn<'a>>) -> Vec<u32> {
    encode_chat_template(turns, true)
}

/// [`encode_chat`] with the closing assistant header optional, as vLLM's
/// `add_generation_prompt`: without it the ids end with the last message's
/// `<|eot_id|>` (what `/tokenize` is asked for to count a conversation
/// alone).
pub fn encode_chat_template<'a>(
    turns: impl IntoIterator<Item = ChatTurn<'a>>,
    add_generation_prompt: bool,
) -> Vec<u32> {
    let mut ids = vec![special::BEGIN_OF_TEXT];
    for turn in turns {
        push_header(turn.role, &mut ids);
        encode_into(turn.content, &mut ids);
        ids.push(special::END_OF_TURN);
    }
    if add_generation_prompt {
        push_header("assistant", &mut ids);
    }
    ids
}

/// Encodes a plain completion prompt: `<|begin_of_text|>` followed by the text.
pub fn encode_prompt(text: &str) -> Vec<u32> {
    let mut ids = vec![special::BEGIN_OF_TEXT];
    encode_into(text, &mut ids);
    ids
}

fn push_header(role: &str, ids: &mut Vec<u32>) {
    ids.push(special::START_HEADER);
    encode_into(role, ids);
    ids.push(special::END_HEADER);
    encode_into("\n\n", ids);
}

fn token_id(piece: &[u8]) -> u32 {
    (xxh3_64(piece) % u64::from(VOCAB_SIZE)) as u32
}

/// Calls `f` with each pre-tokenized piece of `text`, in order.
fn for_each_piece(text: &str, mut f: impl FnMut(&str)) {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        debug_assert_eq!(i, start);
        let end = if c.is_alphanumeric() || (c == ' ' && next_is_alnum(&mut chars)) {
            // A word, possibly with its one leading space.
            if c == ' ' {
                chars.next();
            }
            while chars.peek().is_some_and(|&(_, c)| c.is_alphanumeric()) {
                chars.next();
            }
            chars.peek().map_or(bytes.len(), |&(j, _)| j)
        } else if c.is_whitespace() {
            // A whitespace run, leaving a final single space to the next word.
            loop {
                let Some(&(j, next)) = chars.peek() else {
                    break bytes.len();
                };
                if !next.is_whitespace() {
                    break j;
                }
                if next == ' ' && starts_word_after(text, j) {
                    break j;
                }
                chars.next();
            }
        } else {
            chars.peek().map_or(bytes.len(), |&(j, _)| j)
        };
        f(&text[start..end]);
        start = end;
    }
}

fn next_is_alnum(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>) -> bool {
    chars.peek().is_some_and(|&(_, c)| c.is_alphanumeric())
}

/// Whether the space at byte `at` is directly followed by an alphanumeric char.
fn starts_word_after(text: &str, at: usize) -> bool {
    text[at + 1..]
        .chars()
        .next()
        .is_some_and(char::is_alphanumeric)
}

/// Splits one pre-tokenized piece into token-sized chunks.
fn pieces_in(piece: &str) -> impl Iterator<Item = &str> {
    let whole = piece.len() <= MAX_WHOLE_PIECE_BYTES;
    let mut rest = piece;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = if whole {
            rest.len()
        } else {
            CHUNK_BYTES.min(rest.len())
        };
        // Never cut inside a UTF-8 sequence; a single wide char is one chunk.
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (head, tail) = rest.split_at(cut);
        rest = tail;
        Some(head)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for_each_piece(text, |p| out.extend(pieces_in(p).map(str::to_owned)));
        out
    }

    #[test]
    fn words_keep_one_leading_space_and_punctuation_stands_alone() {
        assert_eq!(pieces("Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(pieces("a  b"), ["a", " ", " b"]);
        assert_eq!(pieces("x\n\ny"), ["x", "\n\n", "y"]);
        assert_eq!(pieces("end "), ["end", " "]);
    }

    #[test]
    fn long_words_are_cut_into_four_byte_chunks() {
        assert_eq!(
            pieces(" internationalization"),
            [" int", "erna", "tion", "aliz", "atio", "n"]
        );
        assert_eq!(pieces(" because"), [" because"]);
    }

    #[test]
    fn multibyte_text_is_never_split_inside_a_character() {
        let text = "日本語のテキストです";
        let joined: String = pieces(text).concat();
        assert_eq!(joined, text);
        assert!(encode(text).len() >= 2);
    }

    #[test]
    fn same_text_gives_same_ids_and_count_matches_encode() {
        let text = "The quick brown fox jumps over the lazy dog. It's 2024!";
        assert_eq!(encode(text), encode(text));
        assert_eq!(count(text), encode(text).len());
        assert!(encode(text).iter().all(|&id| id < VOCAB_SIZE));
    }

    #[test]
    fn shared_prefixes_share_leading_ids() {
        let system = "You are a helpful assistant. Answer briefly and cite sources.";
        let a = encode(&format!("{system} What is the capital of France?"));
        let b = encode(&format!("{system} How tall is Mount Everest?"));
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert!(common >= encode(system).len(), "common={common}");
        assert_ne!(a, b);
    }

    #[test]
    fn english_averages_roughly_four_bytes_per_token() {
        let text = "Large language models generate text one token at a time, and the \
                    server batches many requests together so that the expensive weights \
                    are read from memory once per step for the whole batch.";
        let ratio = text.len() as f64 / count(text) as f64;
        assert!((3.0..=6.5).contains(&ratio), "bytes per token = {ratio}");
    }

    #[test]
    fn chat_template_frames_each_message_and_asks_for_a_reply() {
        let ids = encode_chat([
            ChatTurn {
                role: "system",
                content: "Be brief.",
            },
            ChatTurn {
                role: "user",
                content: "Hi",
            },
        ]);
        assert_eq!(ids[0], special::BEGIN_OF_TEXT);
        assert_eq!(
            ids.iter().filter(|&&t| t == special::START_HEADER).count(),
            3
        );
        assert_eq!(
            ids.iter().filter(|&&t| t == special::END_OF_TURN).count(),
            2
        );
        assert_eq!(ids.last(), encode("\n\n").last());
        // The next turn of the same conversation starts with this prompt's ids,
        // reply header included, so multi-turn chats hit the prefix cache.
        let longer = encode_chat([
            ChatTurn {
                role: "system",
                content: "Be brief.",
            },
            ChatTurn {
                role: "user",
                content: "Hi",
            },
            ChatTurn {
                role: "assistant",
                content: "Hello!",
            },
            ChatTurn {
                role: "user",
                content: "Bye",
            },
        ]);
        assert_eq!(longer[..ids.len()], ids[..]);
    }

    #[test]
    fn without_the_generation_prompt_the_ids_end_with_the_last_turn() {
        let turns = [ChatTurn {
            role: "user",
            content: "Hi",
        }];
        let bare = encode_chat_template(turns, false);
        let asking = encode_chat(turns);
        assert_eq!(bare.last(), Some(&special::END_OF_TURN));
        assert_eq!(asking[..bare.len()], bare[..]);
        let mut header = vec![special::START_HEADER];
        header.extend(encode("assistant"));
        header.push(special::END_HEADER);
        header.extend(encode("\n\n"));
        assert_eq!(asking[bare.len()..], header[..]);
    }
}
