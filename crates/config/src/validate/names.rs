//! Names in a list of the config: given, and unique. A leaf, so every
//! list's checks (pools, listeners, rewrites, members, tenants) can use it.

use std::collections::HashMap;

use crate::problem::Problems;

/// `list[i].name`: not empty, and not the name of an earlier entry
/// (`seen` holds those, with their indexes).
pub fn check_name<'a>(
    p: &mut Problems,
    seen: &mut HashMap<&'a str, usize>,
    list: &str,
    i: usize,
    name: &'a str,
) {
    let path = format!("{list}[{i}].name");
    if name.is_empty() {
        p.add(path, "must not be empty");
    } else if let Some(first) = seen.insert(name, i) {
        p.add(
            path,
            format!("{name:?} is already the name of {list}[{first}]"),
        );
    }
}
