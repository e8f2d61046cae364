//! Why an answer is not continued: what a continuation would not give
//! faithfully.

/// Why an answer is not continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotContinued {
    /// `n` or `best_of` above 1: the other choices' texts are not kept.
    SeveralChoices,
    /// A JSON schema, JSON object, regex, choice or grammar: the engine
    /// would restart the grammar at the continuation's first token.
    StructuredOutput,
    /// A tool call was being streamed.
    ToolCall,
    /// Reasoning was streamed: engines place it outside the message
    /// content a continuation can carry.
    Reasoning,
    /// `logprobs` from an engine not known to give them for a continued
    /// message.
    Logprobs,
    /// A batch of prompts, or token ids with no ids for the answer.
    SeveralPrompts,
    /// The answer outgrew the text kept per stream (`maxTextBytes`).
    TooLong,
    /// An event the gateway could not read.
    Unreadable,
}

impl NotContinued {
    pub fn explain(self) -> &'static str {
        match self {
            NotContinued::SeveralChoices => "it asked for several choices (n > 1)",
            NotContinued::StructuredOutput => {
                "it asked for structured output, which would restart at the continuation"
            }
            NotContinued::ToolCall => "a tool call was being streamed",
            NotContinued::Reasoning => "reasoning was being streamed",
            NotContinued::Logprobs => "it asked for logprobs, which this engine cannot continue",
            NotContinued::SeveralPrompts => "its prompt is a batch or token ids",
            NotContinued::TooLong => "the answer outgrew the text kept to continue it",
            NotContinued::Unreadable => "the replica sent an event the gateway could not read",
        }
    }
}
