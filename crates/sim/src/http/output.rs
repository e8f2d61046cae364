//! What the simulated model "says": how many tokens, and which filler words.
//!
//! Both are deterministic functions of `--seed` and the prompt, so the same
//! request gets the same answer on every replica and in every run — a
//! benchmark comparing two routing policies then compares them on identical
//! work.
//!
//! # Continuations
//!
//! A prompt that ends with the beginning of the answer its head would get is
//! a *continuation* (a gateway resuming an answer a dead replica had started
//! to stream): it gets the rest of that answer, so the parts join into
//! exactly the text of one uninterrupted run. With the original answer
//! `w0 .. w(N-1)` and a prompt carrying `w0 .. w(k-1)`, the answer is
//! `w(k) ..`: the words are drawn from the head's content seed, from
//! position `k` on. Its length is the request's `max_tokens` when set (as
//! for any request, the simulated model then generates exactly that many,
//! `finish_reason: "length"`), else what is left of the head's drawn length
//! `L`: `L - k` tokens, `"stop"` (a prompt with `k >= L` carries a finished
//! answer and is answered as a fresh prompt). Recognising one:
//!
//! - chat ([`resume_chat`]): the final assistant message the request asks
//!   to continue is checked against the answer of the conversation before it;
//! - completion token ids ([`resume_ids`]): the ids end with one word id
//!   without a leading space (the answer's first token) followed by a run of
//!   word ids with one; there is at most one such split, checked once;
//! - completion text ([`resume_text`]): the text ends with filler words; the
//!   candidate splits are where the first of them may start (a suffix of the
//!   alphanumeric run before them, or after a space), tried earliest first,
//!   at most [`MAX_RESUME_CANDIDATES`] of them, each at the cost of
//!   tokenizing the head once. A fresh prompt that does not end with a
//!   filler word costs one look at its last word.
//!
//! A check is a comparison with the answer's own words, so a prompt that is
//! not a continuation passes it only by chance (1 in 64 per word); it then
//! gets another deterministic answer, which no client can tell apart.

use std::sync::OnceLock;

use kv_events::tokenizer;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Median answer length when the client sets no `max_tokens`.
pub const MEDIAN_OUTPUT_TOKENS: f64 = 180.0;
/// Log-normal shape: about two thirds of answers fall within ×/÷ 2.5 of the
/// median, with a long tail of long answers (the shape of ShareGPT-style
/// chat outputs; mean ≈ 270 tokens).
pub const OUTPUT_LENGTH_SIGMA: f64 = 0.9;

/// The seed of one request's answer.
pub fn content_seed(seed: u64, prompt: &[u32]) -> u64 {
    let bytes: Vec<u8> = prompt.iter().flat_map(|id| id.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, seed)
}

/// An answer length drawn from a log-normal distribution, in `1..=cap`.
pub fn draw_output_tokens(content_seed: u64, cap: u32) -> u32 {
    let mut rng = SmallRng::seed_from_u64(content_seed);
    // Box–Muller: one standard normal draw from two uniforms.
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.r#gen();
    let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let tokens = (MEDIAN_OUTPUT_TOKENS.ln() + OUTPUT_LENGTH_SIGMA * normal)
        .exp()
        .round();
    (tokens as u32).clamp(1, cap.max(1))
}

/// How long one answer will be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputPlan {
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Whether the client asked for this length (the answer then ends with
    /// `finish_reason: "length"`, otherwise with `"stop"`).
    pub limited_by_max_tokens: bool,
    /// Seeds the answer's length (when not given) and its words.
    pub content_seed: u64,
    /// Where in the seed's word sequence this answer starts: 0, or the
    /// tokens a continuation's prompt already carries.
    pub first_token: u32,
}

impl OutputPlan {
    /// The words of this answer, from its first.
    pub fn filler(&self) -> Filler {
        Filler::at(self.content_seed, self.first_token)
    }
}

/// A prompt recognised as a continuation: the head whose answer it carries
/// the beginning of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// The head's content seed.
    pub content_seed: u64,
    /// Tokens of the head's answer the prompt already carries.
    pub generated: u32,
    /// The head's prompt tokens (what its drawn length was capped by).
    pub head_tokens: u32,
}

/// Checks the prompt against the context window and settles the answer's
/// length, with vLLM's error messages for requests that do not fit. With
/// `resume`, the answer is the rest of the head's (see the module comment).
pub fn plan(
    seed: u64,
    prompt: &[u32],
    requested: Option<i64>,
    max_model_len: u32,
    resume: Option<Resume>,
) -> Result<OutputPlan, String> {
    let prompt_len = prompt.len() as u64;
    let context = u64::from(max_model_len);
    if prompt_len >= context {
        return Err(format!(
            "This model's maximum context length is {context} tokens. However, your request has \
             {prompt_len} input tokens. Please reduce the length of the input messages."
        ));
    }
    let room = (context - prompt_len) as u32;
    let (content_seed, first_token) = match resume {
        Some(resume) => (resume.content_seed, resume.generated),
        None => (content_seed(seed, prompt), 0),
    };
    match requested {
        Some(n) if n < 1 => Err(format!("max_tokens must be at least 1, got {n}.")),
        Some(n) if prompt_len + n as u64 > context => Err(format!(
            "This model's maximum context length is {context} tokens. However, you requested {} \
             tokens ({prompt_len} in the messages, {n} in the completion). Please reduce the \
             length of the messages or completion.",
            prompt_len + n as u64
        )),
        Some(n) => Ok(OutputPlan {
            max_tokens: n as u32,
            limited_by_max_tokens: true,
            content_seed,
            first_token,
        }),
        None => {
            if let Some(resume) = resume {
                let head_room = max_model_len.saturating_sub(resume.head_tokens);
                let length = draw_output_tokens(resume.content_seed, head_room);
                if resume.generated < length {
                    return Ok(OutputPlan {
                        max_tokens: (length - resume.generated).min(room),
                        limited_by_max_tokens: false,
                        content_seed,
                        first_token,
                    });
                }
                // The prompt carries a finished answer: a fresh prompt.
                return plan(seed, prompt, requested, max_model_len, None);
            }
            Ok(OutputPlan {
                max_tokens: draw_output_tokens(content_seed, room),
                limited_by_max_tokens: false,
                content_seed,
                first_token,
            })
        }
    }
}

/// Filler vocabulary, each word with its leading space and short enough to be
/// one token for [`kv_events::tokenizer`].
const WORDS: [&str; 64] = [
    " the", " model", " answer", " is", " a", " system", " token", " of", " and", " to", " in",
    " that", " request", " with", " for", " this", " server", " batch", " cache", " on", " as",
    " it", " be", " by", " prefix", " from", " at", " which", " can", " more", " time", " each",
    " first", " one", " output", " when", " will", " are", " step", " memory", " so", " than",
    " other", " into", " then", " GPU", " its", " only", " over", " new", " also", " after",
    " between", " under", " load", " queue", " block", " decode", " prompt", " fleet", " route",
    " fast", " replica", " data",
];

/// The token ids of the words: `[0]` without the leading space (an answer's
/// first token), `[1]` with it. They are what tokenizing the answer's text
/// gives, one id per word.
fn word_ids() -> &'static [[u32; 64]; 2] {
    static IDS: OnceLock<[[u32; 64]; 2]> = OnceLock::new();
    IDS.get_or_init(|| {
        let id = |text: &str| tokenizer::encode(text)[0];
        [WORDS.map(|word| id(&word[1..])), WORDS.map(id)]
    })
}

/// The index of `word` (without its leading space) in [`WORDS`].
fn word_index(word: &str) -> Option<usize> {
    WORDS.iter().position(|w| &w[1..] == word)
}

/// Filler words, one per token: `word`, ` word`, ` word`, ...
#[derive(Debug, Clone)]
pub struct Filler {
    state: u64,
    first: bool,
}

/// splitmix64's increment: the state after `n` words is `seed + n × GAMMA`.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Filler {
    pub fn new(content_seed: u64) -> Self {
        Self::at(content_seed, 0)
    }

    /// The words of `content_seed` from the `position`-th on (that word
    /// then has its leading space unless it is the first).
    pub fn at(content_seed: u64, position: u32) -> Self {
        Self {
            state: content_seed.wrapping_add(GAMMA.wrapping_mul(u64::from(position))),
            first: position == 0,
        }
    }

    /// The text of the next token.
    pub fn next_token(&mut self) -> &'static str {
        self.next_with_id().0
    }

    /// The text of the next token and its id.
    pub fn next_with_id(&mut self) -> (&'static str, u32) {
        // splitmix64: cheap, well-mixed, deterministic.
        self.state = self.state.wrapping_add(GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let index = (z % WORDS.len() as u64) as usize;
        let word = WORDS[index];
        if std::mem::take(&mut self.first) {
            (&word[1..], word_ids()[0][index])
        } else {
            (word, word_ids()[1][index])
        }
    }

    /// The whole text of `tokens` tokens.
    pub fn text(mut self, tokens: u32) -> String {
        let mut text = String::with_capacity(tokens as usize * 7);
        for _ in 0..tokens {
            text.push_str(self.next_token());
        }
        text
    }

    /// The token ids of `tokens` tokens.
    pub fn ids(mut self, tokens: u32) -> Vec<u32> {
        (0..tokens).map(|_| self.next_with_id().1).collect()
    }

    /// How many of this filler's words `text` is made of, exactly; `None`
    /// if it is anything else.
    fn words_in(mut self, mut text: &str) -> Option<u32> {
        let mut words = 0;
        while !text.is_empty() {
            text = text.strip_prefix(self.next_token())?;
            words += 1;
        }
        Some(words)
    }
}

/// A chat continuation: `partial` (the final assistant message) is the
/// beginning — possibly empty — of the answer `head` (the conversation before
/// it, with the generation prompt) gets.
pub fn resume_chat(seed: u64, head: &[u32], partial: &str) -> Option<Resume> {
    let content_seed = content_seed(seed, head);
    let generated = Filler::new(content_seed).words_in(partial)?;
    Some(Resume {
        content_seed,
        generated,
        head_tokens: head.len() as u32,
    })
}

/// A completion continuation sent as token ids: the head's ids followed by
/// the ids of the beginning of its answer (at least one token).
pub fn resume_ids(seed: u64, prompt: &[u32]) -> Option<Resume> {
    let [unspaced, spaced] = word_ids();
    let run = prompt
        .iter()
        .rev()
        .take_while(|id| spaced.contains(id))
        .count();
    let split = prompt.len().checked_sub(run + 1)?;
    if split == 0 || !unspaced.contains(&prompt[split]) {
        return None;
    }
    let (head, tail) = prompt.split_at(split);
    let content_seed = content_seed(seed, head);
    let generated = tail.len() as u32;
    (Filler::new(content_seed).ids(generated) == tail).then_some(Resume {
        content_seed,
        generated,
        head_tokens: head.len() as u32,
    })
}

/// At most this many candidate splits of a completion text are checked, each
/// costing one tokenization of the prompt's head (see the module comment).
pub const MAX_RESUME_CANDIDATES: usize = 8;

/// A completion continuation sent as text: the head's text followed by the
/// text of the beginning of its answer (at least one token).
pub fn resume_text(seed: u64, text: &str) -> Option<Resume> {
    resume_candidates(text).into_iter().find_map(|split| {
        let (head, tail) = text.split_at(split);
        let head = tokenizer::encode_prompt(head);
        let content_seed = content_seed(seed, &head);
        let generated = Filler::new(content_seed).words_in(tail)?;
        Some(Resume {
            content_seed,
            generated,
            head_tokens: head.len() as u32,
        })
    })
}

/// Where the answer carried at the end of `text` may start, earliest first
/// (at most [`MAX_RESUME_CANDIDATES`]): the text must end with filler words
/// joined by single spaces; the first of them starts after a space, or
/// is a suffix of the alphanumeric run before the spaced ones (the answer's
/// first word has no space and may stick to the head's last word).
fn resume_candidates(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let is_word_char = |c: char| c.is_alphanumeric();
    // Word starts (after their space) of the trailing ` word ` run, latest first.
    let mut after_space = Vec::new();
    let mut end = bytes.len();
    let run_start = loop {
        let start = text[..end]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_word_char(c))
            .last()
            .map_or(end, |(i, _)| i);
        let spaced = start > 0 && bytes[start - 1] == b' ';
        if spaced && start < end && word_index(&text[start..end]).is_some() {
            after_space.push(start);
            end = start - 1;
        } else {
            break start;
        }
    };
    // The first word may end the run before them, glued or not.
    let mut candidates: Vec<usize> = WORDS
        .iter()
        .map(|word| &word[1..])
        .filter(|word| text[run_start..end].ends_with(word))
        .map(|word| end - word.len())
        .collect();
    candidates.sort_unstable();
    candidates.extend(after_space.iter().rev());
    candidates.truncate(MAX_RESUME_CANDIDATES);
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_filler_word_is_one_token() {
        for word in WORDS {
            assert!(word.starts_with(' '));
            assert_eq!(kv_events::tokenizer::count(word), 1, "{word:?}");
        }
    }

    #[test]
    fn answers_are_deterministic_per_seed_and_prompt() {
        let a = content_seed(7, &[1, 2, 3]);
        assert_eq!(a, content_seed(7, &[1, 2, 3]));
        assert_ne!(a, content_seed(8, &[1, 2, 3]));
        assert_ne!(a, content_seed(7, &[1, 2, 4]));
        assert_eq!(draw_output_tokens(a, 10_000), draw_output_tokens(a, 10_000));
        assert_eq!(Filler::new(a).text(5), Filler::new(a).text(5));
    }

    #[test]
    fn output_lengths_look_like_chat_answers() {
        let mut lengths: Vec<u32> = (0..2000u64)
            .map(|i| draw_output_tokens(i, 100_000))
            .collect();
        lengths.sort_unstable();
        let median = lengths[lengths.len() / 2];
        assert!((150..=215).contains(&median), "median {median}");
        assert!(lengths[lengths.len() * 95 / 100] > 500, "a long tail");
        assert!(lengths.iter().all(|&n| n >= 1));
        assert!(
            (0..200u64).all(|i| draw_output_tokens(i, 64) <= 64),
            "capped"
        );
    }

    #[test]
    fn plans_respect_the_context_window() {
        let prompt = [1u32; 100];
        let asked = plan(0, &prompt, Some(50), 1000, None).unwrap();
        assert_eq!((asked.max_tokens, asked.limited_by_max_tokens), (50, true));
        let drawn = plan(0, &prompt, None, 1000, None).unwrap();
        assert!(!drawn.limited_by_max_tokens);
        assert!((1..=900).contains(&drawn.max_tokens));
        assert!(
            plan(0, &prompt, None, 150, None).unwrap().max_tokens <= 50,
            "capped by the room left"
        );
        assert!(
            plan(0, &prompt, Some(0), 1000, None)
                .unwrap_err()
                .contains("at least 1")
        );
        let too_long = plan(0, &prompt, Some(901), 1000, None).unwrap_err();
        assert!(
            too_long.contains("maximum context length is 1000 tokens"),
            "{too_long}"
        );
        assert!(
            too_long.contains("(100 in the messages, 901 in the completion)"),
            "{too_long}"
        );
        assert!(plan(0, &prompt, Some(900), 1000, None).is_ok());
        assert!(
            plan(0, &prompt, None, 100, None)
                .unwrap_err()
                .contains("100 input tokens")
        );
    }

    #[test]
    fn filler_has_one_word_per_token() {
        let text = Filler::new(3).text(12);
        assert_eq!(text.split(' ').count(), 12);
        assert!(!text.starts_with(' '));
        assert_eq!(kv_events::tokenizer::count(&text), 12);
    }

    /// A completion prompt's answer, whole: its text, ids and finish.
    fn single_run(seed: u64, prompt: &[u32], max_tokens: Option<i64>) -> (String, Vec<u32>, bool) {
        let plan = plan(seed, prompt, max_tokens, 100_000, None).unwrap();
        assert_eq!(plan.first_token, 0);
        (
            plan.filler().text(plan.max_tokens),
            plan.filler().ids(plan.max_tokens),
            plan.limited_by_max_tokens,
        )
    }

    #[test]
    fn word_ids_are_what_tokenizing_the_answer_gives() {
        let [unspaced, spaced] = word_ids();
        let mut all: Vec<u32> = unspaced.iter().chain(spaced).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 128, "the 128 ids are distinct");
        for seed in 0..20 {
            let text = Filler::new(seed).text(40);
            assert_eq!(
                kv_events::tokenizer::encode(&text),
                Filler::new(seed).ids(40)
            );
        }
    }

    #[test]
    fn a_filler_can_start_anywhere() {
        for position in [0u32, 1, 2, 17] {
            let mut whole = Filler::new(9);
            for _ in 0..position {
                whole.next_token();
            }
            assert_eq!(whole.text(10), Filler::at(9, position).text(10));
        }
        let whole = Filler::new(9).text(20);
        let parts = Filler::new(9).text(7) + &Filler::at(9, 7).text(13);
        assert_eq!(whole, parts);
        assert!(Filler::at(9, 7).text(1).starts_with(' '));
    }

    #[test]
    fn completion_ids_resume_the_rest_of_the_answer() {
        let head = kv_events::tokenizer::encode_prompt("Tell me about caching.");
        for seed in [0u64, 1, 7, 42, 1234] {
            let (text, ids, _) = single_run(seed, &head, None);
            let length = ids.len() as u32;
            for k in [1, 2, 5, length / 2, length - 1] {
                let k = k.clamp(1, length - 1);
                let prompt: Vec<u32> = head.iter().chain(&ids[..k as usize]).copied().collect();
                let resume = resume_ids(seed, &prompt).expect("recognised");
                assert_eq!(resume.generated, k);
                assert_eq!(resume.head_tokens as usize, head.len());
                let rest = plan(seed, &prompt, None, 100_000, Some(resume)).unwrap();
                assert_eq!(rest.max_tokens, length - k, "the rest of the drawn length");
                assert!(!rest.limited_by_max_tokens, "ends with stop");
                let first = Filler::new(resume.content_seed).text(k);
                assert_eq!(first + &rest.filler().text(rest.max_tokens), text);
                assert_eq!(rest.filler().ids(rest.max_tokens), ids[k as usize..]);
            }
            // With max_tokens M, the continuation is sent with M - k.
            let (text, ids, limited) = single_run(seed, &head, Some(300));
            assert!(limited);
            let prompt: Vec<u32> = head.iter().chain(&ids[..120]).copied().collect();
            let resume = resume_ids(seed, &prompt);
            let rest = plan(seed, &prompt, Some(180), 100_000, resume).unwrap();
            assert_eq!((rest.max_tokens, rest.limited_by_max_tokens), (180, true));
            assert_eq!(
                Filler::new(rest.content_seed).text(120) + &rest.filler().text(180),
                text
            );
        }
        // Not continuations: the head alone, other words, an empty head.
        let (_, ids, _) = single_run(3, &head, Some(10));
        assert_eq!(resume_ids(3, &head), None);
        let mut wrong: Vec<u32> = head.iter().chain(&ids[..4]).copied().collect();
        wrong.swap(head.len() + 1, head.len() + 2);
        assert_eq!(resume_ids(3, &wrong), None);
        assert_eq!(resume_ids(3, &ids[..4]), None);
        assert_eq!(resume_ids(3, &[]), None);
    }

    #[test]
    fn a_continuation_of_a_finished_answer_is_a_fresh_prompt() {
        let head = kv_events::tokenizer::encode_prompt("Short?");
        let (_, ids, _) = single_run(5, &head, None);
        let prompt: Vec<u32> = head.iter().chain(&ids).copied().collect();
        let resume = resume_ids(5, &prompt).expect("recognised");
        assert_eq!(resume.generated as usize, ids.len());
        let fresh = plan(5, &prompt, None, 100_000, Some(resume)).unwrap();
        assert_eq!(fresh, plan(5, &prompt, None, 100_000, None).unwrap());
        // With max_tokens it goes on: the simulated model has no end of its own.
        let more = plan(5, &prompt, Some(3), 100_000, Some(resume)).unwrap();
        assert_eq!(more.first_token as usize, ids.len());
    }

    #[test]
    fn completion_text_resumes_whatever_the_head_ends_with() {
        let heads = [
            "Tell me about caching.",
            "Tell me about caching",
            "Tell me about caching ",
            "Q: the model is",
            "Q: the model is ",
            "Count: 1",
            "line one\nline two\n",
            "日本語",
            "",
            "the model answer is a system token of",
        ];
        for head in heads {
            let head_ids = kv_events::tokenizer::encode_prompt(head);
            for seed in [0u64, 3, 99] {
                let (text, ids, _) = single_run(seed, &head_ids, Some(60));
                for k in [1u32, 2, 3, 30, 59] {
                    let carried = Filler::new(content_seed(seed, &head_ids)).text(k);
                    let prompt = format!("{head}{carried}");
                    let resume = resume_text(seed, &prompt)
                        .unwrap_or_else(|| panic!("{prompt:?} not recognised"));
                    assert_eq!(resume.generated, k, "{prompt:?}");
                    let prompt_ids = kv_events::tokenizer::encode_prompt(&prompt);
                    let rest = plan(
                        seed,
                        &prompt_ids,
                        Some(i64::from(60 - k)),
                        100_000,
                        Some(resume),
                    )
                    .unwrap();
                    assert_eq!(
                        carried + &rest.filler().text(rest.max_tokens),
                        text,
                        "{prompt:?}"
                    );
                    assert_eq!(rest.filler().ids(rest.max_tokens), ids[k as usize..]);
                }
            }
        }
    }

    #[test]
    fn fresh_texts_cost_few_candidates() {
        assert!(resume_candidates("What is a KV cache?").is_empty());
        assert!(resume_candidates("Explain caching").is_empty());
        assert_eq!(resume_candidates("Show data"), ["Show ".len()]);
        assert_eq!(
            resume_candidates("Explain data"),
            [5, 8],
            "Expla|in, or data"
        );
        let long = "word ".repeat(10_000) + &" the".repeat(1000);
        assert_eq!(resume_candidates(&long).len(), MAX_RESUME_CANDIDATES);
        assert_eq!(resume_text(0, "What is a KV cache?"), None);
    }

    #[test]
    fn chat_partials_resume_or_not() {
        let head = kv_events::tokenizer::encode_chat([kv_events::tokenizer::ChatTurn {
            role: "user",
            content: "hi",
        }]);
        let seed = content_seed(4, &head);
        let partial = Filler::new(seed).text(6);
        let resume = resume_chat(4, &head, &partial).unwrap();
        assert_eq!((resume.content_seed, resume.generated), (seed, 6));
        assert_eq!(resume_chat(4, &head, "").unwrap().generated, 0);
        assert_eq!(resume_chat(4, &head, "Sure, here it is"), None);
        assert_eq!(resume_chat(4, &head, &format!("{partial} ")), None);
        assert_eq!(
            resume_chat(5, &head, &partial),
            None,
            "another seed's answer"
        );
    }
}
