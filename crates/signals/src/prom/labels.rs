//! The label set of one sample, decoded on demand from the borrowed text.
//!
//! The parser has already checked the syntax, so reading labels here only
//! has to find the boundaries again; values are unescaped (and allocated)
//! only when they contain an escape sequence.

use std::borrow::Cow;

/// Labels of a sample: the text between `{` and `}`, already validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Labels<'a> {
    raw: &'a str,
}

impl<'a> Labels<'a> {
    /// `raw` must have passed the parser's label-block check.
    pub(crate) fn from_validated(raw: &'a str) -> Self {
        Self { raw }
    }

    /// The text between the braces, escapes untouched.
    pub fn as_raw(&self) -> &'a str {
        self.raw
    }

    pub fn is_empty(&self) -> bool {
        self.raw_pairs().next().is_none()
    }

    /// The value of label `name`, unescaped. Borrowed unless the value
    /// contains an escape sequence.
    pub fn get(&self, name: &str) -> Option<Cow<'a, str>> {
        self.raw_pairs()
            .find(|pair| pair.name == name)
            .map(RawPair::value)
    }

    /// Every `(name, value)` pair in the order the text lists them.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, Cow<'a, str>)> + 'a {
        self.raw_pairs().map(|pair| (pair.name, pair.value()))
    }

    fn raw_pairs(&self) -> RawPairs<'a> {
        RawPairs {
            raw: self.raw,
            pos: 0,
        }
    }
}

/// A label whose value is still escaped.
struct RawPair<'a> {
    name: &'a str,
    value: &'a str,
    escaped: bool,
}

impl<'a> RawPair<'a> {
    fn value(self) -> Cow<'a, str> {
        if self.escaped {
            Cow::Owned(unescape(self.value))
        } else {
            Cow::Borrowed(self.value)
        }
    }
}

struct RawPairs<'a> {
    raw: &'a str,
    pos: usize,
}

impl<'a> Iterator for RawPairs<'a> {
    type Item = RawPair<'a>;

    fn next(&mut self) -> Option<RawPair<'a>> {
        let bytes = self.raw.as_bytes();
        let mut i = self.pos;
        while i < bytes.len() && matches!(bytes[i], b' ' | b'\t' | b',') {
            i += 1;
        }
        if i >= bytes.len() {
            self.pos = i;
            return None;
        }
        let name_start = i;
        while i < bytes.len() && !matches!(bytes[i], b' ' | b'\t' | b'=') {
            i += 1;
        }
        let name = &self.raw[name_start..i];
        // Skip blanks, '=', blanks and the opening quote.
        while i < bytes.len() && bytes[i] != b'"' {
            i += 1;
        }
        i += 1;
        let value_start = i;
        let mut escaped = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                b'"' => break,
                _ => i += 1,
            }
        }
        let value = &self.raw[value_start..i.min(bytes.len())];
        self.pos = i + 1;
        Some(RawPair {
            name,
            value,
            escaped,
        })
    }
}

/// Undo the three escapes of the text format: `\\`, `\"` and `\n`.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_finds_labels_in_any_order() {
        let labels = Labels::from_validated(r#"b="2", a="1",c="3","#);
        assert_eq!(labels.get("a").as_deref(), Some("1"));
        assert_eq!(labels.get("b").as_deref(), Some("2"));
        assert_eq!(labels.get("c").as_deref(), Some("3"));
        assert_eq!(labels.get("d"), None);
    }

    #[test]
    fn unescaped_values_are_borrowed() {
        let labels = Labels::from_validated(r#"path="/v1/models""#);
        assert!(matches!(
            labels.get("path"),
            Some(Cow::Borrowed("/v1/models"))
        ));
    }

    #[test]
    fn escapes_are_decoded() {
        let labels = Labels::from_validated(r#"msg="a \"quoted\" \\ path\nnext",x="}""#);
        assert_eq!(
            labels.get("msg").as_deref(),
            Some("a \"quoted\" \\ path\nnext")
        );
        assert_eq!(labels.get("x").as_deref(), Some("}"));
    }

    #[test]
    fn iter_keeps_text_order_and_empty_values() {
        let labels = Labels::from_validated(r#"z="", y = "v""#);
        let pairs: Vec<(&str, String)> = labels.iter().map(|(k, v)| (k, v.into_owned())).collect();
        assert_eq!(pairs, [("z", String::new()), ("y", "v".to_owned())]);
    }

    #[test]
    fn empty_block_has_no_labels() {
        assert!(Labels::from_validated("").is_empty());
        assert!(Labels::from_validated(" ").is_empty());
        assert!(!Labels::from_validated(r#"a="""#).is_empty());
    }
}
