//! The multi-turn agent workload: many concurrent agent loops, each a
//! session whose context grows turn after turn.
//!
//! An agent sends the same instructions and tool definitions (a system
//! prompt every loop shares), then, turn after turn, its whole transcript
//! so far: each turn adds the model's last answer (a tool call) and the
//! tool's output, so the context grows by a few hundred to a thousand
//! tokens a turn over 4-10 turns (at most about 13k tokens, as long as
//! the longest conversations of the shared-prefix scenario), with a short
//! pause (the tool running) between turns. Everything but the newest tool output is a prefix the
//! replica that served the previous turn has cached, which is what session
//! affinity is for.
//!
//! It is the shared-prefix mix with agent-shaped numbers: one shared
//! system prompt instead of a few documents, more and faster turns, and
//! short answers.

use super::{LengthDist, Mix, Range};

/// The agent mix of the `agent` scenario.
pub fn agent_loops() -> Mix {
    Mix::SharedPrefix {
        // Instructions and tool schemas, shared by every loop.
        documents: 1,
        document_tokens: Range {
            min: 1500,
            max: 1500,
        },
        // A tool's output: a file, a search result, a command's output.
        question_tokens: Range {
            min: 200,
            max: 1000,
        },
        turns: Range { min: 4, max: 10 },
        // The tool running between turns.
        think_seconds: 2.0,
        // A tool call or a short reasoning step.
        output: LengthDist {
            median: 80.0,
            sigma: 0.5,
            min: 8,
            max: 400,
        },
    }
}
