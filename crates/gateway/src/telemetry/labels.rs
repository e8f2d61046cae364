//! Label values of the gateway's metric series.

use std::sync::Arc;

/// A label value shared by every series of a pool, model or replica:
/// cloning it for a lookup is a reference-count increment.
pub(super) type Name = Arc<String>;
