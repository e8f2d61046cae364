//! Prompt text with a known token count.
//!
//! Prompts are made of pseudo-words that the simulator's tokenizer reads as
//! one token each (a leading space plus two to six letters), with a period
//! every dozen words or so. Building the text and its token ids side by side
//! lets the virtual-time fleet hand the engine exactly the ids a simulated
//! replica would compute from the same JSON body, without running the
//! tokenizer on millions of prompts (a test checks the two agree).

use std::sync::{Arc, OnceLock};

use rand::Rng;
use sim::tokenizer::{self, ChatTurn};

/// Distinct words; enough that unrelated prompts never share a block.
const VOCABULARY_SIZE: usize = 4096;
const CONSONANTS: &[u8] = b"bcdfghjklmnprstvwz";
const VOWELS: &[u8] = b"aeiou";

/// Words and the token id of each (with its leading space).
struct Vocabulary {
    words: Vec<String>,
    ids: Vec<u32>,
    period: u32,
}

fn vocabulary() -> &'static Vocabulary {
    static VOCABULARY: OnceLock<Vocabulary> = OnceLock::new();
    VOCABULARY.get_or_init(|| {
        let syllables: Vec<[u8; 2]> = CONSONANTS
            .iter()
            .flat_map(|&c| VOWELS.iter().map(move |&v| [c, v]))
            .collect();
        let words: Vec<String> = (0..VOCABULARY_SIZE)
            .map(|i| {
                // The first 90 words have one syllable, the rest two: about
                // five bytes per token with the space, close to English's
                // four to five.
                let mut word = String::from(" ");
                let mut n = i;
                loop {
                    let s = syllables[n % syllables.len()];
                    word.push(s[0] as char);
                    word.push(s[1] as char);
                    n /= syllables.len();
                    if n == 0 {
                        break;
                    }
                }
                word
            })
            .collect();
        let ids = words
            .iter()
            .map(|w| {
                let ids = tokenizer::encode(w);
                assert_eq!(ids.len(), 1, "vocabulary word {w:?} must be one token");
                ids[0]
            })
            .collect();
        let period = tokenizer::encode(".")[0];
        Vocabulary { words, ids, period }
    })
}

/// A run of prompt text and its token ids (as `sim::tokenizer` encodes it).
/// Concatenating two texts concatenates their ids: every piece starts at a
/// word boundary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Text {
    pub text: String,
    pub ids: Vec<u32>,
}

impl Text {
    /// `tokens` tokens of random words.
    pub fn random<R: Rng + ?Sized>(tokens: u32, rng: &mut R) -> Text {
        let vocabulary = vocabulary();
        let mut text = Text {
            text: String::with_capacity(tokens as usize * 6),
            ids: Vec::with_capacity(tokens as usize),
        };
        let mut until_period = rng.gen_range(8..16);
        while text.ids.len() < tokens as usize {
            if until_period == 0 && text.ids.len() + 1 < tokens as usize {
                text.text.push('.');
                text.ids.push(vocabulary.period);
                until_period = rng.gen_range(8..16);
                continue;
            }
            let word = rng.gen_range(0..VOCABULARY_SIZE);
            text.text.push_str(&vocabulary.words[word]);
            text.ids.push(vocabulary.ids[word]);
            until_period -= 1;
        }
        text
    }

    pub fn tokens(&self) -> u32 {
        self.ids.len() as u32
    }
}

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One chat message; the content is shared between the turns of a
/// conversation and between requests quoting the same document.
#[derive(Debug, Clone)]
pub struct Message {
    pub role: Role,
    pub content: Arc<Text>,
}

/// The token ids a simulated replica computes for these messages: the
/// Llama-3 chat template of `sim::tokenizer::encode_chat`, assembled from
/// the ids the texts already carry.
pub fn chat_prompt_ids(messages: &[Message]) -> Vec<u32> {
    let headers = role_headers();
    let content: usize = messages.iter().map(|m| m.content.ids.len()).sum();
    let mut ids = Vec::with_capacity(content + 8 * messages.len() + 8);
    ids.push(tokenizer::special::BEGIN_OF_TEXT);
    for message in messages {
        ids.extend_from_slice(&headers[message.role as usize]);
        ids.extend_from_slice(&message.content.ids);
        ids.push(tokenizer::special::END_OF_TURN);
    }
    ids.extend_from_slice(&headers[Role::Assistant as usize]);
    ids
}

/// The template's header ids of each role, indexed by `Role as usize`.
fn role_headers() -> &'static [Vec<u32>; 3] {
    static HEADERS: OnceLock<[Vec<u32>; 3]> = OnceLock::new();
    HEADERS.get_or_init(|| {
        [Role::System, Role::User, Role::Assistant].map(|role| {
            // The template of an empty conversation is BEGIN + the header
            // that asks `role` for a reply; a one-message conversation
            // shows the same header in front of the message.
            let turn = tokenizer::encode_chat([ChatTurn {
                role: role.as_str(),
                content: "",
            }]);
            let end = turn
                .iter()
                .position(|&t| t == tokenizer::special::END_OF_TURN)
                .expect("the template closes every turn");
            turn[1..end].to_vec()
        })
    })
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn random_text_has_the_requested_token_count_under_the_real_tokenizer() {
        let mut rng = SmallRng::seed_from_u64(7);
        for tokens in [1, 2, 15, 16, 17, 1000] {
            let text = Text::random(tokens, &mut rng);
            assert_eq!(text.tokens(), tokens);
            assert_eq!(tokenizer::encode(&text.text), text.ids, "{tokens} tokens");
        }
    }

    #[test]
    fn chat_ids_match_the_simulator_template() {
        let mut rng = SmallRng::seed_from_u64(3);
        let document = Arc::new(Text::random(300, &mut rng));
        let messages = vec![
            Message {
                role: Role::System,
                content: document,
            },
            Message {
                role: Role::User,
                content: Arc::new(Text::random(40, &mut rng)),
            },
            Message {
                role: Role::Assistant,
                content: Arc::new(Text::random(25, &mut rng)),
            },
            Message {
                role: Role::User,
                content: Arc::new(Text::random(12, &mut rng)),
            },
        ];
        let expected = tokenizer::encode_chat(messages.iter().map(|m| ChatTurn {
            role: m.role.as_str(),
            content: &m.content.text,
        }));
        assert_eq!(chat_prompt_ids(&messages), expected);
    }

    #[test]
    fn words_are_about_as_long_as_english_tokens() {
        let mut rng = SmallRng::seed_from_u64(1);
        let text = Text::random(10_000, &mut rng);
        let bytes_per_token = text.text.len() as f64 / f64::from(text.tokens());
        assert!(
            (4.0..=6.0).contains(&bytes_per_token),
            "{bytes_per_token} bytes per token"
        );
    }
}
