//! What the clients send, and when: seeded, so every policy and both modes
//! see exactly the same requests at exactly the same (simulated) times.
//!
//! A workload is a [`Traffic`] shape (steady Poisson or bursts) and a
//! request [`Mix`] (chat, shared documents with multi-turn conversations,
//! LoRA adapters). [`Workload::stream`] yields [`RequestPlan`]s in arrival
//! order, lazily, so a million-request run never holds its prompts at once.
//!
//! Request `k` has the same content at every load level: contents come from
//! a random stream keyed by the request's index, arrival times from another
//! one. Changing the load rescales the arrival times only.

pub mod agent;
mod arrivals;
pub mod text;

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use arrivals::ArrivalClock;
pub use arrivals::Traffic;
use config::Priority;
pub use text::{Message, Role, Text, chat_prompt_ids};

/// A log-normal length in tokens, clamped to `[min, max]`: the usual shape
/// of chat prompt and answer lengths (ShareGPT-style traces have a
/// long right tail).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LengthDist {
    pub median: f64,
    /// Standard deviation of the length's logarithm.
    pub sigma: f64,
    pub min: u32,
    pub max: u32,
}

impl LengthDist {
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        let normal = standard_normal(rng);
        let length = (self.median.ln() + self.sigma * normal).exp().round();
        (length as u32).clamp(self.min, self.max)
    }
}

/// Box–Muller: one standard normal draw from two uniforms.
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.r#gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A uniform integer range, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub min: u32,
    pub max: u32,
}

impl Range {
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        rng.gen_range(self.min..=self.max)
    }

    fn mean(&self) -> f64 {
        (f64::from(self.min) + f64::from(self.max)) / 2.0
    }
}

/// The kind of requests a workload sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Mix {
    /// Independent single-turn chat requests, after a system prompt of
    /// `system_tokens` that every request shares (none when 0).
    Chat {
        system_tokens: u32,
        prompt: LengthDist,
        output: LengthDist,
    },
    /// Users asking about one of a few long documents (a system prompt
    /// shared by everyone who asks about it), in conversations of several
    /// turns: each turn resends the conversation so far.
    SharedPrefix {
        documents: u32,
        document_tokens: Range,
        question_tokens: Range,
        /// Turns per conversation.
        turns: Range,
        /// Mean pause between a turn and the next one, seconds (exponential).
        think_seconds: f64,
        output: LengthDist,
    },
    /// Chat requests for LoRA adapters of one base model; adapter `i` is
    /// asked for with Zipf(`zipf_exponent`) popularity.
    Lora {
        adapters: Vec<String>,
        zipf_exponent: f64,
        prompt: LengthDist,
        output: LengthDist,
    },
}

impl Mix {
    /// Requests per session: turns per conversation, or 1. Arrival rates
    /// are set in sessions, so this converts a request rate.
    pub fn requests_per_session(&self) -> f64 {
        match self {
            Mix::SharedPrefix { turns, .. } => turns.mean(),
            Mix::Chat { .. } | Mix::Lora { .. } => 1.0,
        }
    }
}

/// A traffic shape, a request mix, and the model name clients ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    pub traffic: Traffic,
    pub mix: Mix,
    /// The `model` of base-model requests (the pool's served name).
    pub model: String,
    /// Priority bands the clients mark their requests with, or none (the
    /// gateway's default band for every request).
    pub bands: Option<BandMix>,
}

/// Shares of the requests in each priority band (they sum to 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BandMix {
    pub critical: f64,
    pub standard: f64,
    pub sheddable: f64,
}

impl BandMix {
    pub fn share(&self, band: Priority) -> f64 {
        match band {
            Priority::Critical => self.critical,
            Priority::Standard => self.standard,
            Priority::Sheddable => self.sheddable,
        }
    }

    /// The band at `u` in `[0, 1)` of the cumulative shares.
    fn pick(&self, u: f64) -> Priority {
        if u < self.critical {
            Priority::Critical
        } else if u < self.critical + self.standard {
            Priority::Standard
        } else {
            Priority::Sheddable
        }
    }
}

/// One request as a client will send it.
#[derive(Debug, Clone)]
pub struct RequestPlan {
    /// Position in arrival order, from 0.
    pub id: u64,
    /// Arrival time, simulated seconds from the start of the run.
    pub at: f64,
    /// The body's `model`: the base model or an adapter name.
    pub model: Arc<str>,
    /// The adapter, when `model` names one.
    pub adapter: Option<Arc<str>>,
    pub messages: Vec<Message>,
    /// Tokens to generate (the simulated model answers with exactly this
    /// many).
    pub max_tokens: u32,
    /// The client session the request belongs to (every turn of a
    /// conversation shares it), sent as OpenAI's `user` field, which a
    /// gateway with `sessions: {user: true}` keys sessions by.
    pub session: u64,
}

impl RequestPlan {
    /// The OpenAI chat-completions body.
    pub fn body(&self, stream: bool) -> Value {
        let messages: Vec<Value> = self
            .messages
            .iter()
            .map(|m| json!({"role": m.role.as_str(), "content": m.content.text}))
            .collect();
        let mut body = json!({
            "model": &*self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "user": self.user(),
        });
        if stream {
            body["stream"] = Value::Bool(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    /// The body's `user`: the client session.
    pub fn user(&self) -> String {
        format!("session-{}", self.session)
    }

    /// Prompt token ids as a simulated replica computes them from
    /// [`RequestPlan::body`].
    pub fn prompt_ids(&self) -> Vec<u32> {
        chat_prompt_ids(&self.messages)
    }

    /// Bytes of message text, as the gateway counts them for its in-flight
    /// token estimate.
    pub fn prompt_chars(&self) -> u64 {
        self.messages
            .iter()
            .map(|m| m.content.text.len() as u64)
            .sum()
    }
}

/// A seeded workload: its documents are drawn once, its requests on demand.
#[derive(Debug, Clone)]
pub struct Workload {
    spec: WorkloadSpec,
    seed: u64,
    model: Arc<str>,
    adapters: Vec<Arc<str>>,
    /// Shared documents (shared-prefix mix) or the shared system prompt
    /// (chat mix).
    documents: Vec<Arc<Text>>,
}

impl Workload {
    pub fn new(spec: WorkloadSpec, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(stream_seed(seed, Stream::Documents, 0));
        let documents = match &spec.mix {
            Mix::SharedPrefix {
                documents,
                document_tokens,
                ..
            } => (0..*documents)
                .map(|_| Arc::new(Text::random(document_tokens.sample(&mut rng), &mut rng)))
                .collect(),
            Mix::Chat { system_tokens, .. } if *system_tokens > 0 => {
                vec![Arc::new(Text::random(*system_tokens, &mut rng))]
            }
            _ => Vec::new(),
        };
        let adapters = match &spec.mix {
            Mix::Lora { adapters, .. } => adapters.iter().map(|a| Arc::from(a.as_str())).collect(),
            _ => Vec::new(),
        };
        Workload {
            model: Arc::from(spec.model.as_str()),
            spec,
            seed,
            adapters,
            documents,
        }
    }

    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// The band request `id` is marked with, if the workload has bands.
    /// Drawn from its own stream, so adding bands changes nothing else
    /// about the requests.
    pub fn band(&self, id: u64) -> Option<Priority> {
        let bands = self.spec.bands?;
        let mut rng = SmallRng::seed_from_u64(stream_seed(self.seed, Stream::Bands, id));
        Some(bands.pick(rng.r#gen()))
    }

    /// Requests arriving in `[0, duration)` at a mean of `rate` requests
    /// per simulated second, in arrival order.
    pub fn stream(&self, rate: f64, duration: f64) -> RequestStream<'_> {
        let sessions_per_second = rate / self.spec.mix.requests_per_session();
        RequestStream {
            workload: self,
            clock: ArrivalClock::new(
                &self.spec.traffic,
                sessions_per_second,
                stream_seed(self.seed, Stream::Arrivals, 0),
            ),
            duration,
            next_session: 0,
            next_session_at: None,
            follow_ups: BinaryHeap::new(),
            next_id: 0,
        }
    }

    /// The first `count` requests' contents, ignoring time (for capacity
    /// calibration).
    pub fn sample(&self, count: usize) -> Vec<RequestPlan> {
        self.stream(1.0, f64::INFINITY).take(count).collect()
    }

    /// Everything about session `index` except its arrival time: one
    /// request, or the turns of a conversation.
    fn session(&self, index: u64) -> Session {
        let mut rng = SmallRng::seed_from_u64(stream_seed(self.seed, Stream::Sessions, index));
        match &self.spec.mix {
            Mix::Chat { prompt, output, .. } => Session {
                system: self.documents.first().cloned(),
                ..Session::single(
                    Arc::clone(&self.model),
                    None,
                    user_turn(prompt.sample(&mut rng), &mut rng),
                    output.sample(&mut rng),
                )
            },
            Mix::Lora {
                zipf_exponent,
                prompt,
                output,
                ..
            } => {
                let adapter = Arc::clone(
                    &self.adapters[zipf_index(self.adapters.len(), *zipf_exponent, &mut rng)],
                );
                Session::single(
                    Arc::clone(&adapter),
                    Some(adapter),
                    user_turn(prompt.sample(&mut rng), &mut rng),
                    output.sample(&mut rng),
                )
            }
            Mix::SharedPrefix {
                question_tokens,
                turns,
                think_seconds,
                output,
                ..
            } => {
                let document = &self.documents[rng.gen_range(0..self.documents.len())];
                let turns = (0..turns.sample(&mut rng))
                    .map(|_| Turn {
                        question: Arc::new(Text::random(
                            question_tokens.sample(&mut rng),
                            &mut rng,
                        )),
                        answer_tokens: output.sample(&mut rng),
                        pause: -think_seconds * (1.0 - rng.r#gen::<f64>()).ln(),
                    })
                    .collect();
                Session {
                    id: 0,
                    model: Arc::clone(&self.model),
                    adapter: None,
                    system: Some(Arc::clone(document)),
                    turns,
                    answer_seed: rng.r#gen(),
                }
            }
        }
    }
}

fn user_turn<R: Rng + ?Sized>(tokens: u32, rng: &mut R) -> Arc<Text> {
    Arc::new(Text::random(tokens, rng))
}

/// A Zipf-distributed index in `0..n` (index 0 most popular), by inverting
/// the cumulative weights; `n` is small (tens of adapters).
fn zipf_index<R: Rng + ?Sized>(n: usize, exponent: f64, rng: &mut R) -> usize {
    let weight = |i: usize| 1.0 / ((i + 1) as f64).powf(exponent);
    let total: f64 = (0..n).map(weight).sum();
    let mut target = rng.r#gen::<f64>() * total;
    for i in 0..n {
        target -= weight(i);
        if target <= 0.0 {
            return i;
        }
    }
    n - 1
}

/// Independent random streams of one seed.
#[derive(Clone, Copy)]
enum Stream {
    Documents = 1,
    Arrivals = 2,
    Sessions = 3,
    Bands = 4,
}

fn stream_seed(seed: u64, stream: Stream, index: u64) -> u64 {
    // SplitMix64 of (seed, stream, index): nearby seeds and indexes give
    // unrelated streams.
    let mut z = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add((stream as u64) << 56)
        .wrapping_add(index);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A user's questions in one conversation.
struct Turn {
    question: Arc<Text>,
    answer_tokens: u32,
    /// Pause before the next turn, seconds.
    pause: f64,
}

/// One client session: a single request or a conversation.
struct Session {
    /// Its index in arrival order.
    id: u64,
    model: Arc<str>,
    adapter: Option<Arc<str>>,
    system: Option<Arc<Text>>,
    turns: Vec<Turn>,
    /// Seeds the answers quoted back in later turns.
    answer_seed: u64,
}

impl Session {
    fn single(model: Arc<str>, adapter: Option<Arc<str>>, prompt: Arc<Text>, output: u32) -> Self {
        Session {
            id: 0,
            model,
            adapter,
            system: None,
            turns: vec![Turn {
                question: prompt,
                answer_tokens: output,
                pause: 0.0,
            }],
            answer_seed: 0,
        }
    }

    /// The request of turn `turn`: the document, every earlier question
    /// and answer, and this turn's question.
    fn request(&self, turn: usize, answers: &[Arc<Text>]) -> (Vec<Message>, u32) {
        let mut messages = Vec::with_capacity(2 * turn + 2);
        if let Some(system) = &self.system {
            messages.push(Message {
                role: Role::System,
                content: Arc::clone(system),
            });
        }
        for (earlier, answer) in self.turns[..turn].iter().zip(answers) {
            messages.push(Message {
                role: Role::User,
                content: Arc::clone(&earlier.question),
            });
            messages.push(Message {
                role: Role::Assistant,
                content: Arc::clone(answer),
            });
        }
        messages.push(Message {
            role: Role::User,
            content: Arc::clone(&self.turns[turn].question),
        });
        (messages, self.turns[turn].answer_tokens)
    }
}

/// A later turn of a conversation, waiting for its arrival time.
struct FollowUp {
    at: f64,
    session: Arc<Session>,
    turn: usize,
    /// The answers of the turns before it.
    answers: Vec<Arc<Text>>,
}

impl PartialEq for FollowUp {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for FollowUp {}

impl PartialOrd for FollowUp {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FollowUp {
    /// Reversed: the earliest follow-up is the heap's maximum.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.total_cmp(&self.at)
    }
}

/// The requests of a workload in arrival order; see [`Workload::stream`].
pub struct RequestStream<'a> {
    workload: &'a Workload,
    clock: ArrivalClock,
    duration: f64,
    next_session: u64,
    next_session_at: Option<f64>,
    follow_ups: BinaryHeap<FollowUp>,
    next_id: u64,
}

impl RequestStream<'_> {
    fn emit(
        &mut self,
        at: f64,
        session: Arc<Session>,
        turn: usize,
        answers: Vec<Arc<Text>>,
    ) -> RequestPlan {
        let (messages, max_tokens) = session.request(turn, &answers);
        if turn + 1 < session.turns.len() {
            // The answer this turn will get, as the user's next turn quotes
            // it: as many words as the simulated model will generate.
            let mut rng = SmallRng::seed_from_u64(session.answer_seed ^ turn as u64);
            let mut answers = answers;
            answers.push(Arc::new(Text::random(max_tokens, &mut rng)));
            self.follow_ups.push(FollowUp {
                at: at + session.turns[turn].pause,
                session: Arc::clone(&session),
                turn: turn + 1,
                answers,
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        RequestPlan {
            id,
            at,
            model: Arc::clone(&session.model),
            adapter: session.adapter.clone(),
            messages,
            max_tokens,
            session: session.id,
        }
    }
}

impl Iterator for RequestStream<'_> {
    type Item = RequestPlan;

    fn next(&mut self) -> Option<RequestPlan> {
        let new_at = *self
            .next_session_at
            .get_or_insert_with(|| self.clock.next_arrival());
        let follow_up_at = self.follow_ups.peek().map(|f| f.at);
        if follow_up_at.is_some_and(|f| f < new_at) {
            let FollowUp {
                at,
                session,
                turn,
                answers,
            } = self.follow_ups.pop().expect("peeked");
            if at >= self.duration {
                return None;
            }
            return Some(self.emit(at, session, turn, answers));
        }
        if new_at >= self.duration {
            return None;
        }
        self.next_session_at = None;
        let session = Arc::new(Session {
            id: self.next_session,
            ..self.workload.session(self.next_session)
        });
        self.next_session += 1;
        Some(self.emit(new_at, session, 0, Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat() -> WorkloadSpec {
        WorkloadSpec {
            traffic: Traffic::Poisson,
            mix: Mix::Chat {
                system_tokens: 0,
                prompt: LengthDist {
                    median: 1000.0,
                    sigma: 0.8,
                    min: 16,
                    max: 8000,
                },
                output: LengthDist {
                    median: 200.0,
                    sigma: 0.7,
                    min: 8,
                    max: 2000,
                },
            },
            model: "m".into(),
            bands: None,
        }
    }

    fn shared_prefix() -> WorkloadSpec {
        WorkloadSpec {
            traffic: Traffic::Poisson,
            mix: Mix::SharedPrefix {
                documents: 3,
                document_tokens: Range { min: 200, max: 400 },
                question_tokens: Range { min: 10, max: 20 },
                turns: Range { min: 2, max: 4 },
                think_seconds: 5.0,
                output: LengthDist {
                    median: 30.0,
                    sigma: 0.5,
                    min: 5,
                    max: 100,
                },
            },
            model: "m".into(),
            bands: None,
        }
    }

    #[test]
    fn same_seed_same_requests_and_load_only_rescales_time() {
        let workload = Workload::new(chat(), 11);
        let slow: Vec<_> = workload.stream(10.0, 20.0).collect();
        let again: Vec<_> = Workload::new(chat(), 11).stream(10.0, 20.0).collect();
        let fast: Vec<_> = workload.stream(20.0, 10.0).collect();
        assert!(slow.len() > 100, "{} requests", slow.len());
        assert_eq!(slow.len(), again.len());
        for (a, b) in slow.iter().zip(&again) {
            assert_eq!(a.at, b.at);
            assert_eq!(a.prompt_ids(), b.prompt_ids());
        }
        for (a, b) in slow.iter().zip(&fast) {
            assert_eq!(a.prompt_ids(), b.prompt_ids());
            assert_eq!(a.max_tokens, b.max_tokens);
            assert!((a.at - 2.0 * b.at).abs() < 1e-9);
        }
        assert!(slow.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn chat_lengths_follow_the_distribution() {
        let plans = Workload::new(chat(), 5).sample(2000);
        let mut prompts: Vec<u32> = plans.iter().map(|p| p.prompt_ids().len() as u32).collect();
        prompts.sort_unstable();
        let median = prompts[prompts.len() / 2];
        assert!((850..1150).contains(&median), "median prompt {median}");
        let mean_output =
            plans.iter().map(|p| f64::from(p.max_tokens)).sum::<f64>() / plans.len() as f64;
        // Log-normal mean = median × exp(σ²/2) ≈ 256.
        assert!((220.0..290.0).contains(&mean_output), "{mean_output}");
    }

    #[test]
    fn conversations_resend_their_history() {
        let plans: Vec<_> = Workload::new(shared_prefix(), 2)
            .stream(2.0, 200.0)
            .collect();
        assert!(plans.windows(2).all(|w| w[0].at <= w[1].at));
        let later = plans
            .iter()
            .find(|p| p.messages.len() == 4)
            .expect("some second turns");
        // system document, question, answer, question
        let roles: Vec<_> = later.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::User]
        );
        // The first turn of the same conversation is a prefix of it.
        let first = plans
            .iter()
            .find(|p| {
                p.messages.len() == 2
                    && Arc::ptr_eq(&p.messages[1].content, &later.messages[1].content)
            })
            .expect("the first turn came earlier");
        assert!(first.at < later.at);
        assert_eq!(
            later.messages[2].content.tokens(),
            first.max_tokens,
            "the quoted answer is as long as the answer"
        );
        let first_ids = first.prompt_ids();
        let later_ids = later.prompt_ids();
        // Everything but the trailing assistant header is shared.
        let shared = first_ids.len() - 4;
        assert_eq!(first_ids[..shared], later_ids[..shared]);
    }

    #[test]
    fn lora_requests_name_their_adapter_and_favour_the_first() {
        let spec = WorkloadSpec {
            mix: Mix::Lora {
                adapters: (0..8).map(|i| format!("a{i}")).collect(),
                zipf_exponent: 1.0,
                prompt: LengthDist {
                    median: 100.0,
                    sigma: 0.5,
                    min: 10,
                    max: 400,
                },
                output: LengthDist {
                    median: 50.0,
                    sigma: 0.5,
                    min: 5,
                    max: 200,
                },
            },
            ..chat()
        };
        let plans = Workload::new(spec, 9).sample(4000);
        let count = |name: &str| {
            plans
                .iter()
                .filter(|p| p.adapter.as_deref() == Some(name))
                .count()
        };
        assert!(
            plans
                .iter()
                .all(|p| p.adapter.as_deref() == Some(&*p.model))
        );
        assert!(
            count("a0") > 2 * count("a3"),
            "{} vs {}",
            count("a0"),
            count("a3")
        );
        assert!(count("a7") > 0);
    }

    #[test]
    fn chat_can_share_a_system_prompt() {
        let spec = WorkloadSpec {
            mix: Mix::Chat {
                system_tokens: 64,
                prompt: LengthDist {
                    median: 50.0,
                    sigma: 0.3,
                    min: 10,
                    max: 100,
                },
                output: LengthDist {
                    median: 20.0,
                    sigma: 0.3,
                    min: 5,
                    max: 50,
                },
            },
            ..chat()
        };
        let plans = Workload::new(spec, 3).sample(3);
        for plan in &plans {
            assert_eq!(plan.messages[0].role, Role::System);
            assert_eq!(plan.messages[0].content.tokens(), 64);
            assert!(Arc::ptr_eq(
                &plan.messages[0].content,
                &plans[0].messages[0].content
            ));
        }
    }

    #[test]
    fn bands_follow_their_shares_and_leave_the_requests_alone() {
        let mix = BandMix {
            critical: 0.2,
            standard: 0.5,
            sheddable: 0.3,
        };
        let banded = Workload::new(
            WorkloadSpec {
                bands: Some(mix),
                ..chat()
            },
            4,
        );
        let plain = Workload::new(chat(), 4);
        assert_eq!(plain.band(0), None);
        let (a, b) = (banded.sample(500), plain.sample(500));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.at, x.max_tokens), (y.at, y.max_tokens));
            assert_eq!(x.prompt_ids(), y.prompt_ids());
        }
        let n = 10_000;
        for band in Priority::ALL {
            let count = (0..n).filter(|&id| banded.band(id) == Some(band)).count();
            let share = count as f64 / n as f64;
            assert!((share - mix.share(band)).abs() < 0.02, "{band:?}: {share}");
        }
        assert_eq!(
            banded.band(17),
            Workload::new(banded.spec().clone(), 4).band(17)
        );
    }

    #[test]
    fn body_is_an_openai_streaming_chat_request() {
        let plan = Workload::new(chat(), 1).sample(1).remove(0);
        let body = plan.body(true);
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["max_tokens"], plan.max_tokens);
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(
            plan.prompt_chars(),
            body["messages"][0]["content"].as_str().unwrap().len() as u64
        );
    }
}
