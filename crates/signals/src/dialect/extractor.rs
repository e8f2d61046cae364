//! What every engine's file implements, and the one way an exposition is
//! run through it. A leaf: the engines and [`super::Dialect`] both use it.

use picker::EngineState;

use crate::prom::{self, ParseError};

/// Folds the samples of one engine's families into an [`EngineState`].
pub(super) trait Extractor<'a>: prom::Visitor<'a> + Default {
    fn finish(self) -> EngineState;
}

/// The engine state `E` reads from `text`.
pub(super) fn run<'a, E: Extractor<'a>>(text: &'a str) -> Result<EngineState, ParseError> {
    let mut extractor = E::default();
    prom::parse(text, &mut extractor)?;
    Ok(extractor.finish())
}
