//! What the simulated model "says": how many tokens, and which filler words.
//!
//! Both are deterministic functions of `--seed` and the prompt, so the same
//! request gets the same answer on every replica and in every run — a
//! benchmark comparing two routing policies then compares them on identical
//! work.

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
}

/// Checks the prompt against the context window and settles the answer's
/// length, with vLLM's error messages for requests that do not fit.
pub fn plan(
    seed: u64,
    prompt: &[u32],
    requested: Option<i64>,
    max_model_len: u32,
) -> Result<OutputPlan, String> {
    let prompt_len = prompt.len() as u64;
    let context = u64::from(max_model_len);
    if prompt_len >= context {
        return Err(format!(
            "This model's maximum context length is {context} tokens. However, your request has \
             {prompt_len} input tokens. Please reduce the length of the input messages."
        ));
    }
    let content_seed = content_seed(seed, prompt);
    let room = (context - prompt_len) as u32;
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
        }),
        None => Ok(OutputPlan {
            max_tokens: draw_output_tokens(content_seed, room),
            limited_by_max_tokens: false,
            content_seed,
        }),
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

/// Filler words, one per token: `word`, ` word`, ` word`, ...
#[derive(Debug, Clone)]
pub struct Filler {
    state: u64,
    first: bool,
}

impl Filler {
    pub fn new(content_seed: u64) -> Self {
        Self {
            state: content_seed,
            first: true,
        }
    }

    /// The text of the next token.
    pub fn next_token(&mut self) -> &'static str {
        // splitmix64: cheap, well-mixed, deterministic.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let word = WORDS[(z % WORDS.len() as u64) as usize];
        if std::mem::take(&mut self.first) {
            &word[1..]
        } else {
            word
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
        let asked = plan(0, &prompt, Some(50), 1000).unwrap();
        assert_eq!((asked.max_tokens, asked.limited_by_max_tokens), (50, true));
        let drawn = plan(0, &prompt, None, 1000).unwrap();
        assert!(!drawn.limited_by_max_tokens);
        assert!((1..=900).contains(&drawn.max_tokens));
        assert!(
            plan(0, &prompt, None, 150).unwrap().max_tokens <= 50,
            "capped by the room left"
        );
        assert!(
            plan(0, &prompt, Some(0), 1000)
                .unwrap_err()
                .contains("at least 1")
        );
        let too_long = plan(0, &prompt, Some(901), 1000).unwrap_err();
        assert!(
            too_long.contains("maximum context length is 1000 tokens"),
            "{too_long}"
        );
        assert!(
            too_long.contains("(100 in the messages, 901 in the completion)"),
            "{too_long}"
        );
        assert!(plan(0, &prompt, Some(900), 1000).is_ok());
        assert!(
            plan(0, &prompt, None, 100)
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
}
