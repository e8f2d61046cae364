//! Label values of the gateway's metric series.

use std::sync::Arc;

/// A label value shared by every series of a pool, model or replica:
/// cloning it for a lookup is a reference-count increment.
pub(super) type Name = Arc<String>;

/// A request's `tenant` label: a tenant listed in `spec.tenants`, `other`
/// for every tenant that is not, or `anonymous`. Made once per tenant per
/// generation; cloning it is a reference-count increment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantLabel(pub(super) Name);

impl TenantLabel {
    pub fn new(name: &str) -> Self {
        Self(Arc::new(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}
