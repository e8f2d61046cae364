//! Why a replica was picked: per-candidate scores for logs and the
//! `x-infergate-scores` response header.

use std::fmt;
use std::sync::Arc;

use crate::endpoint::Endpoint;
use crate::scorers::Scorer;

/// One candidate's scores in a [`crate::Policy::Scored`] pick.
#[derive(Debug, Clone)]
pub struct CandidateScore {
    pub endpoint: Arc<Endpoint>,
    /// Weighted mean of `parts`, in `[0, 1]`.
    pub total: f64,
    /// Each scorer's score, in [`Scorer::ALL`] order.
    pub parts: [f64; Scorer::COUNT],
}

impl CandidateScore {
    pub fn part(&self, scorer: Scorer) -> f64 {
        self.parts[scorer as usize]
    }
}

/// `addr=total(q=..,kv=..,if=..,px=..,lora=..,ss=..)`
impl fmt::Display for CandidateScore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:.2}(", self.endpoint.addr, self.total)?;
        for (i, scorer) in Scorer::ALL.into_iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}={:.2}", scorer.label(), self.parts[i])?;
        }
        f.write_str(")")
    }
}

/// The winner's total and the best total among the others: the margin of a
/// decision, cheap enough to log for every request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopScores {
    pub winner: f64,
    /// `None` when there was a single candidate.
    pub runner_up: Option<f64>,
}

/// Candidates joined with `;`, best first, at most `limit` of them; a
/// trailing `;+N` says how many were left out.
#[derive(Debug, Clone, Copy)]
pub struct ScoresHeader<'a> {
    pub scores: &'a [CandidateScore],
    pub limit: usize,
}

impl fmt::Display for ScoresHeader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, score) in self.scores.iter().take(self.limit).enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{score}")?;
        }
        if self.scores.len() > self.limit {
            write!(f, ";+{}", self.scores.len() - self.limit)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(addr: &str, total: f64) -> CandidateScore {
        CandidateScore {
            endpoint: Endpoint::new(0, addr),
            total,
            parts: [1.0, 0.7, 1.0, 0.5, 1.0, 1.0, 1.0],
        }
    }

    #[test]
    fn compact_header_format() {
        let s = score("127.0.0.1:9001", 0.8125);
        assert_eq!(
            s.to_string(),
            "127.0.0.1:9001=0.81(q=1.00,kv=0.70,if=1.00,px=0.50,lora=1.00,sp=1.00,ss=1.00)"
        );
        assert_eq!(s.part(Scorer::Prefix), 0.5);
        let scores = [s, score("b:1", 0.5), score("c:1", 0.25)];
        let header = ScoresHeader {
            scores: &scores,
            limit: 2,
        }
        .to_string();
        assert!(header.starts_with("127.0.0.1:9001=0.81("));
        assert!(header.contains(";b:1=0.50("));
        assert!(header.ends_with(";+1"));
        assert!(!header.contains("c:1"));
    }
}
