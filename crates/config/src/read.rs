//! Reading a YAML document into a typed value while collecting every
//! structural problem: unknown fields, values of the wrong type, missing
//! required fields. A deserializer that stops at the first error would
//! report one typo per run; this one reports them all.
//!
//! The document is parsed into a [`Value`] tree, and the target type is
//! deserialized from that tree through [`Node`], which knows where it is
//! (`spec.pools[1].scheduling`). A struct announces its field names to the
//! deserializer, so keys it does not know are noted and skipped without
//! stopping. A value that does not fit stops the run; it is noted, and the
//! run starts again with that value replaced by a [`Placeholder`] (an empty
//! value of whatever type is asked for), until a run completes. Each problem
//! gets the line and column the YAML parser gives its key or value.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess,
    Unexpected, Visitor,
};
use serde_yaml_ng::Value;

use crate::problem::{Problem, Unreadable};

/// More problems than this and the rest are left for the next run.
const MAX_PROBLEMS: usize = 100;

/// What [`read`] made of a document.
pub(crate) struct Read<T> {
    /// The value, when the document could be read as a whole (values that
    /// did not fit are replaced by empty ones, and listed in `unreadable`).
    pub value: Option<T>,
    pub problems: Vec<Problem>,
    /// Paths of values that were replaced: checks of what is at or under
    /// them would only be about the placeholder.
    pub unreadable: Unreadable,
}

/// Read `text` as a `T`, noting every structural problem with its path.
pub(crate) fn read<T: DeserializeOwned>(text: &str) -> Read<T> {
    let root: Value = match serde_yaml_ng::from_str(text) {
        Ok(root) => root,
        Err(e) => return Read::refused(e.to_string()),
    };
    if root.is_null() {
        return Read::refused("the document is empty".to_owned());
    }
    let reader = Reader {
        text,
        replaced: RefCell::default(),
        found: RefCell::default(),
        as_written: RefCell::default(),
    };
    // Each run either completes or replaces one more value (or an ancestor
    // of one), so there are at most as many runs as values in the document.
    loop {
        match T::deserialize(Node::new(&root, Path::default(), &reader)) {
            Ok(value) => return reader.finish(Some(value)),
            Err(e) => {
                let (path, place) = match e.kind {
                    ErrorKind::Missing(field) => (e.path.field(field), Place::In(e.path)),
                    ErrorKind::Message(_) => (e.path.clone(), Place::Value(e.path)),
                };
                if reader.is_replaced(&path) {
                    // Even an empty value does not fit here: give up on the
                    // value around it.
                    let widened = path
                        .parent()
                        .is_some_and(|parent| reader.replaced.borrow_mut().insert(parent));
                    if !widened {
                        return reader.finish(None);
                    }
                    continue;
                }
                let message = match e.kind {
                    ErrorKind::Missing(_) => "required field is missing".to_owned(),
                    ErrorKind::Message(message) => message,
                };
                reader.note(path.clone(), message, place);
                reader.replaced.borrow_mut().insert(path);
                if reader.found.borrow().len() >= MAX_PROBLEMS {
                    return reader.finish(None);
                }
            }
        }
    }
}

impl<T> Read<T> {
    fn refused(message: String) -> Self {
        Read {
            value: None,
            problems: vec![Problem {
                path: String::new(),
                message,
            }],
            unreadable: Unreadable::new(vec![String::new()]),
        }
    }
}

/// Where a problem shows in the text.
#[derive(Clone, Debug)]
enum Place {
    /// At the key of the entry at this path (an unknown field).
    Key(Path),
    /// At the value at this path.
    Value(Path),
    /// Inside the mapping at this path (a missing field).
    In(Path),
}

struct Found {
    path: Path,
    message: String,
    place: Place,
}

/// State shared by every run over one document.
struct Reader<'t> {
    text: &'t str,
    /// Values read as placeholders.
    replaced: RefCell<HashSet<Path>>,
    /// Problems so far, in the order they were found (document order).
    found: RefCell<Vec<Found>>,
    /// Scalars read as written, kept for the next runs.
    as_written: RefCell<HashMap<(Path, Want), Option<Scalar>>>,
}

impl Reader<'_> {
    /// Note a problem once, however many runs come across it.
    fn note(&self, path: Path, message: String, place: Place) {
        let mut found = self.found.borrow_mut();
        if !found.iter().any(|f| f.path == path) {
            found.push(Found {
                path,
                message,
                place,
            });
        }
    }

    fn as_written(&self, path: &Path, want: Want) -> Option<Scalar> {
        self.as_written
            .borrow_mut()
            .entry((path.clone(), want))
            .or_insert_with(|| scalar_as_written(self.text, path, want))
            .clone()
    }

    fn is_replaced(&self, path: &Path) -> bool {
        self.replaced.borrow().contains(path)
    }

    fn finish<T>(self, value: Option<T>) -> Read<T> {
        let found = self.found.into_inner();
        let mut problems: Vec<Problem> = found
            .into_iter()
            .map(|f| {
                let message = match locate(self.text, &f.place) {
                    Some((line, column)) => format!("{} at line {line} column {column}", f.message),
                    None => f.message,
                };
                Problem {
                    path: f.path.to_string(),
                    message,
                }
            })
            .collect();
        if value.is_none() && problems.len() >= MAX_PROBLEMS {
            problems.push(Problem {
                path: String::new(),
                message: format!(
                    "stopped after {} problems; fix these and check again",
                    problems.len()
                ),
            });
        }
        if value.is_none() && problems.is_empty() {
            problems.push(Problem {
                path: String::new(),
                message: "the document cannot be read".to_owned(),
            });
        }
        let mut unreadable: Vec<String> = self
            .replaced
            .into_inner()
            .iter()
            .map(Path::to_string)
            .collect();
        unreadable.sort();
        Read {
            value,
            problems,
            unreadable: Unreadable::new(unreadable),
        }
    }
}

/// A place in the document: `spec.pools[1].scheduling`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Path(Vec<Segment>);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Segment {
    /// A struct field.
    Field(String),
    /// An element of a sequence.
    Index(usize),
    /// A key of a map with free keys (`objectives`).
    Key(String),
}

impl Path {
    fn child(&self, segment: Segment) -> Path {
        let mut segments = self.0.clone();
        segments.push(segment);
        Path(segments)
    }

    fn field(&self, name: &str) -> Path {
        self.child(Segment::Field(name.to_owned()))
    }

    fn parent(&self) -> Option<Path> {
        let (_, parent) = self.0.split_last()?;
        Some(Path(parent.to_vec()))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Field(name) if i == 0 => f.write_str(name)?,
                Segment::Field(name) => write!(f, ".{name}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::Key(key) => write!(f, "[{key:?}]")?,
            }
        }
        Ok(())
    }
}

/// An error of one run, with the path of the value it is about.
#[derive(Debug)]
struct ReadError {
    path: Path,
    /// Whether `path` is set yet: the innermost [`Node`] sets it.
    placed: bool,
    kind: ErrorKind,
}

#[derive(Debug)]
enum ErrorKind {
    Message(String),
    /// A struct without this required field.
    Missing(&'static str),
}

impl ReadError {
    fn at(mut self, path: &Path) -> Self {
        if !self.placed {
            self.path = path.clone();
            self.placed = true;
        }
        self
    }

    fn yaml(error: serde_yaml_ng::Error) -> Self {
        de::Error::custom(error)
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Message(message) => f.write_str(message),
            ErrorKind::Missing(field) => write!(f, "missing field `{field}`"),
        }
    }
}

impl std::error::Error for ReadError {}

impl de::Error for ReadError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        ReadError {
            path: Path::default(),
            placed: false,
            kind: ErrorKind::Message(message.to_string()),
        }
    }

    fn missing_field(field: &'static str) -> Self {
        ReadError {
            path: Path::default(),
            placed: false,
            kind: ErrorKind::Missing(field),
        }
    }
}

/// The value at `path`, deserialized by the type that wants it. Leaves are
/// handed to `serde_yaml_ng`'s own deserializer for [`Value`]; mappings and
/// sequences are walked here, so that every value knows its path.
struct Node<'de, 'r> {
    value: &'de Value,
    path: Path,
    reader: &'r Reader<'r>,
}

/// A synthetic entry (a required field that is missing) reads as null.
static NULL: Value = Value::Null;

impl<'de, 'r> Node<'de, 'r> {
    fn new(value: &'de Value, path: Path, reader: &'r Reader<'r>) -> Self {
        Node {
            value,
            path,
            reader,
        }
    }

    fn replaced(&self) -> bool {
        self.reader.is_replaced(&self.path)
    }

    fn entries(&self, fields: Option<&'static [&'static str]>) -> Entries<'de, 'r> {
        Entries {
            entries: self.value.as_mapping().map(|mapping| mapping.iter()),
            fields,
            present: Vec::new(),
            next_field: 0,
            path: self.path.clone(),
            reader: self.reader,
            pending: None,
        }
    }

    fn elements(&self) -> Elements<'de, 'r> {
        static EMPTY: Vec<Value> = Vec::new();
        let sequence = self.value.as_sequence().unwrap_or(&EMPTY);
        Elements {
            elements: sequence.iter().enumerate(),
            len: sequence.len(),
            path: self.path.clone(),
            reader: self.reader,
        }
    }
}

/// Leaves: `serde_yaml_ng` reads them; placeholders stand in for values
/// already reported.
macro_rules! leaves {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
            if self.replaced() {
                return Placeholder.$method(visitor).map_err(|e| e.at(&self.path));
            }
            self.value
                .$method(visitor)
                .map_err(|e| ReadError::yaml(e).at(&self.path))
        }
    )*};
}

/// Numbers and booleans: a plain scalar the YAML schema resolved to a
/// string (`02`) is read as written, as the type asks, as a YAML
/// deserializer reading straight into the type would.
macro_rules! scalars {
    ($($method:ident => $want:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
            if self.replaced() {
                return Placeholder.$method(visitor).map_err(|e| e.at(&self.path));
            }
            let as_written = match self.value {
                Value::String(_) | Value::Tagged(_) => {
                    self.reader.as_written(&self.path, Want::$want)
                }
                _ => None,
            };
            match as_written {
                Some(scalar) => scalar.visit(visitor),
                None => self.value.$method(visitor).map_err(ReadError::yaml),
            }
            .map_err(|e| e.at(&self.path))
        }
    )*};
}

impl<'de> Deserializer<'de> for Node<'de, '_> {
    type Error = ReadError;

    leaves! {
        deserialize_i128 deserialize_u128 deserialize_char deserialize_bytes
        deserialize_byte_buf deserialize_unit deserialize_identifier deserialize_ignored_any
    }

    scalars! {
        deserialize_bool => Bool
        deserialize_i8 => Signed deserialize_i16 => Signed
        deserialize_i32 => Signed deserialize_i64 => Signed
        deserialize_u8 => Unsigned deserialize_u16 => Unsigned
        deserialize_u32 => Unsigned deserialize_u64 => Unsigned
        deserialize_f32 => Float deserialize_f64 => Float
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        if self.replaced() {
            return Placeholder
                .deserialize_any(visitor)
                .map_err(|e| e.at(&self.path));
        }
        let result = match self.value {
            Value::Mapping(_) => visitor.visit_map(self.entries(None)),
            Value::Sequence(_) => visitor.visit_seq(self.elements()),
            value => value.deserialize_any(visitor).map_err(ReadError::yaml),
        };
        result.map_err(|e| e.at(&self.path))
    }

    /// A plain scalar is a string as written: `name: 1.50` is `"1.50"`.
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        if self.replaced() {
            return Placeholder
                .deserialize_string(visitor)
                .map_err(|e| e.at(&self.path));
        }
        let as_written = match self.value {
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::Tagged(_) => {
                self.reader.as_written(&self.path, Want::Text)
            }
            _ => None,
        };
        match as_written {
            Some(scalar) => scalar.visit(visitor),
            None => self
                .value
                .deserialize_string(visitor)
                .map_err(ReadError::yaml),
        }
        .map_err(|e| e.at(&self.path))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        if self.replaced() {
            return Placeholder
                .deserialize_option(visitor)
                .map_err(|e| e.at(&self.path));
        }
        let path = self.path.clone();
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
        .map_err(|e| e.at(&path))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        let path = self.path.clone();
        visitor.visit_newtype_struct(self).map_err(|e| e.at(&path))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        if self.replaced() {
            return Placeholder
                .deserialize_seq(visitor)
                .map_err(|e| e.at(&self.path));
        }
        let result = match self.value {
            Value::Sequence(_) | Value::Null => visitor.visit_seq(self.elements()),
            value => value.deserialize_seq(visitor).map_err(ReadError::yaml),
        };
        result.map_err(|e| e.at(&self.path))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        if self.replaced() {
            return Placeholder
                .deserialize_map(visitor)
                .map_err(|e| e.at(&self.path));
        }
        let result = match self.value {
            Value::Mapping(_) | Value::Null => visitor.visit_map(self.entries(None)),
            value => value.deserialize_map(visitor).map_err(ReadError::yaml),
        };
        result.map_err(|e| e.at(&self.path))
    }

    /// Keys that are not among `fields` are noted and skipped, so the
    /// struct's own check for unknown fields never stops the run.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        if self.replaced() {
            return Placeholder
                .deserialize_struct(name, fields, visitor)
                .map_err(|e| e.at(&self.path));
        }
        let result = match self.value {
            Value::Mapping(_) | Value::Null => visitor.visit_map(self.entries(Some(fields))),
            value => value
                .deserialize_struct(name, fields, visitor)
                .map_err(ReadError::yaml),
        };
        result.map_err(|e| e.at(&self.path))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        if self.replaced() {
            return Placeholder
                .deserialize_enum(name, variants, visitor)
                .map_err(|e| e.at(&self.path));
        }
        let result = match self.value {
            Value::String(_) | Value::Tagged(_) => self
                .value
                .deserialize_enum(name, variants, visitor)
                .map_err(ReadError::yaml),
            value => Err(de::Error::invalid_type(
                unexpected(value),
                &one_of(variants).as_str(),
            )),
        };
        result.map_err(|e| e.at(&self.path))
    }
}

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Unexpected::Unsigned(u),
            (_, Some(i), _) => Unexpected::Signed(i),
            (_, _, Some(f)) => Unexpected::Float(f),
            _ => Unexpected::Other("number"),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Sequence(_) => Unexpected::Seq,
        Value::Mapping(_) => Unexpected::Map,
        Value::Tagged(_) => Unexpected::Other("tagged value"),
    }
}

fn one_of(names: &[&str]) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match names.as_slice() {
        [] => "nothing".to_owned(),
        [one] => one.clone(),
        [rest @ .., last] => format!("one of {}, {last}", rest.join(", ")),
    }
}

/// A mapping's entries. For a struct, keys that are not fields are noted
/// and skipped; required fields that are missing and already reported are
/// added, with a placeholder, at the end.
struct Entries<'de, 'r> {
    /// `None` for null, read as a mapping without entries.
    entries: Option<serde_yaml_ng::mapping::Iter<'de>>,
    fields: Option<&'static [&'static str]>,
    /// Fields given in the document.
    present: Vec<&'de str>,
    /// Next field to consider for a placeholder, once the entries are done.
    next_field: usize,
    path: Path,
    reader: &'r Reader<'r>,
    pending: Option<Node<'de, 'r>>,
}

impl<'de> MapAccess<'de> for Entries<'de, '_> {
    type Error = ReadError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ReadError> {
        let Some(fields) = self.fields else {
            // A map with free keys.
            let Some((key, value)) = self.entries.as_mut().and_then(Iterator::next) else {
                return Ok(None);
            };
            let path = self.path.child(Segment::Key(key_text(key)));
            let key = seed
                .deserialize(key)
                .map_err(|e| ReadError::yaml(e).at(&path))?;
            self.pending = Some(Node::new(value, path, self.reader));
            return Ok(Some(key));
        };
        while let Some((key, value)) = self.entries.as_mut().and_then(Iterator::next) {
            let name = key_text(key);
            let path = self.path.field(&name);
            match (key.as_str(), fields.iter().find(|f| **f == name)) {
                (Some(given), Some(field)) => {
                    self.present.push(given);
                    self.pending = Some(Node::new(value, path, self.reader));
                    return seed
                        .deserialize(BorrowedStrDeserializer::new(field))
                        .map(Some);
                }
                _ => {
                    let message = unknown_field(&name, fields);
                    self.reader.note(path.clone(), message, Place::Key(path));
                }
            }
        }
        while let Some(field) = fields.get(self.next_field) {
            self.next_field += 1;
            let path = self.path.field(field);
            if !self.present.contains(field) && self.reader.is_replaced(&path) {
                self.pending = Some(Node::new(&NULL, path, self.reader));
                return seed
                    .deserialize(BorrowedStrDeserializer::new(field))
                    .map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, ReadError> {
        let node = self
            .pending
            .take()
            .ok_or_else(|| <ReadError as de::Error>::custom("a value without a key"))?;
        seed.deserialize(node)
    }
}

/// A key as it is written, for paths and messages.
fn key_text(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other)
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_default(),
    }
}

/// serde's message, and the field that was probably meant.
fn unknown_field(key: &str, fields: &'static [&'static str]) -> String {
    let message = <ReadError as de::Error>::unknown_field(key, fields).to_string();
    match closest(key, fields) {
        Some(meant) => format!("{message}; did you mean `{meant}`?"),
        None => message,
    }
}

/// The field `key` is a near miss of: the same but for case, or at most two
/// edits away (and fewer than half its letters).
fn closest<'f>(key: &str, fields: &[&'f str]) -> Option<&'f str> {
    if let Some(same) = fields.iter().find(|f| f.eq_ignore_ascii_case(key)) {
        return Some(same);
    }
    fields
        .iter()
        .map(|f| (edit_distance(key, f), *f))
        .filter(|(d, _)| *d <= 2 && *d * 2 < key.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

struct Elements<'de, 'r> {
    elements: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
    len: usize,
    path: Path,
    reader: &'r Reader<'r>,
}

impl<'de> SeqAccess<'de> for Elements<'de, '_> {
    type Error = ReadError;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, ReadError> {
        let Some((index, value)) = self.elements.next() else {
            return Ok(None);
        };
        self.len -= 1;
        let path = self.path.child(Segment::Index(index));
        seed.deserialize(Node::new(value, path, self.reader))
            .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.len)
    }
}

/// An empty value of whatever type asks: `""`, `0`, `false`, none, no
/// elements, a struct of placeholders, an enum's first variant. It stands
/// in for a value already reported, so the rest of the document is read.
struct Placeholder;

impl<'de> Deserializer<'de> for Placeholder {
    type Error = ReadError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_unit()
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_bool(false)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_i64(0)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_u64(0)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_f64(0.0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_str("")
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_none()
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_seq(de::value::SeqDeserializer::new(std::iter::empty::<()>()))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_map(de::value::MapDeserializer::new(
            std::iter::empty::<((), ())>(),
        ))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        visitor.visit_map(de::value::MapDeserializer::new(
            fields.iter().map(|field| (*field, Placeholder)),
        ))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        let first = variants.first().copied().unwrap_or_default();
        visitor.visit_enum(de::value::StrDeserializer::new(first))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        char bytes byte_buf unit unit_struct tuple tuple_struct identifier
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_i64(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_i64(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_i64(visitor)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_u64(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_u64(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_u64(visitor)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_f64(visitor)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_str(visitor)
    }
}

impl<'de> de::IntoDeserializer<'de, ReadError> for Placeholder {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

// Finding a path in the text. The YAML parser places the errors it sees in
// the text; to find where a path is, the document is read again by a
// visitor that walks down that path and fails at the end of it.

/// Line and column (from 1) of `place` in `text`.
fn locate(text: &str, place: &Place) -> Option<(usize, usize)> {
    let (path, at_key) = match place {
        Place::Key(path) => (path, true),
        Place::Value(path) | Place::In(path) => (path, false),
    };
    if path.0.is_empty() {
        return None;
    }
    let seek = Seek {
        rest: &path.0,
        at_key,
        action: &Action::Fail,
    };
    let error = seek
        .deserialize(serde_yaml_ng::Deserializer::from_str(text))
        .err()?;
    let location = error.location()?;
    Some((location.line(), location.column()))
}

/// The scalar at `path` as written, read as `want` (`1.50` as a string is
/// `"1.50"`, not `"1.5"`; `02` as a number is 2), or `None` if it cannot be.
fn scalar_as_written(text: &str, path: &Path, want: Want) -> Option<Scalar> {
    let found = RefCell::new(None);
    let seek = Seek {
        rest: &path.0,
        at_key: false,
        action: &Action::Read(want, &found),
    };
    seek.deserialize(serde_yaml_ng::Deserializer::from_str(text))
        .ok()?;
    found.into_inner()
}

enum Action<'a> {
    /// Fail at the place, so that the parser names its position.
    Fail,
    /// Read the scalar there.
    Read(Want, &'a RefCell<Option<Scalar>>),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Want {
    Text,
    Unsigned,
    Signed,
    Float,
    Bool,
}

#[derive(Clone)]
enum Scalar {
    Text(String),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    fn read<'de, D: Deserializer<'de>>(want: Want, deserializer: D) -> Result<Self, D::Error> {
        use serde::Deserialize;
        Ok(match want {
            Want::Text => Scalar::Text(String::deserialize(deserializer)?),
            Want::Unsigned => Scalar::Unsigned(u64::deserialize(deserializer)?),
            Want::Signed => Scalar::Signed(i64::deserialize(deserializer)?),
            Want::Float => Scalar::Float(f64::deserialize(deserializer)?),
            Want::Bool => Scalar::Bool(bool::deserialize(deserializer)?),
        })
    }

    fn visit<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        match self {
            Scalar::Text(s) => visitor.visit_string(s),
            Scalar::Unsigned(n) => visitor.visit_u64(n),
            Scalar::Signed(n) => visitor.visit_i64(n),
            Scalar::Float(n) => visitor.visit_f64(n),
            Scalar::Bool(b) => visitor.visit_bool(b),
        }
    }
}

/// Walks down `rest`; everything beside the path is skipped.
#[derive(Clone, Copy)]
struct Seek<'a> {
    rest: &'a [Segment],
    at_key: bool,
    action: &'a Action<'a>,
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        if !self.rest.is_empty() {
            return deserializer.deserialize_any(self);
        }
        match self.action {
            Action::Fail => deserializer.deserialize_any(Refuse),
            Action::Read(want, found) => {
                *found.borrow_mut() = Some(Scalar::read(*want, deserializer)?);
                Ok(())
            }
        }
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (wanted, rest) = self.rest.split_first().expect("seek has a path");
        let wanted = match wanted {
            Segment::Field(name) | Segment::Key(name) => Some(name.as_str()),
            Segment::Index(_) => None,
        };
        let fail_at_key = self.at_key && rest.is_empty();
        while let Some(matched) = map.next_key_seed(KeyMatch {
            wanted,
            fail: fail_at_key,
        })? {
            if matched {
                map.next_value_seed(Seek { rest, ..self })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (wanted, rest) = self.rest.split_first().expect("seek has a path");
        let wanted = match wanted {
            Segment::Index(index) => Some(*index),
            _ => None,
        };
        let mut index = 0;
        loop {
            let more = if Some(index) == wanted {
                seq.next_element_seed(Seek { rest, ..self })?.is_some()
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    // Scalars where the path goes on: the path is not in the text.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let (IgnoredAny, variant) = data.variant()?;
        de::VariantAccess::newtype_variant::<IgnoredAny>(variant).map(|_| ())
    }
}

/// Whether a key is the one wanted; fails at it when asked to.
struct KeyMatch<'a> {
    wanted: Option<&'a str>,
    fail: bool,
}

impl<'de> DeserializeSeed<'de> for KeyMatch<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyMatch<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        let matched = self.wanted == Some(key);
        if matched && self.fail {
            return Err(E::custom("here"));
        }
        Ok(matched)
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// Fails on any value.
struct Refuse;

impl Visitor<'_> for Refuse {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nothing")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_are_suggested() {
        let fields = &["policy", "preset", "weights", "maxLoras"];
        assert_eq!(closest("polcy", fields), Some("policy"));
        assert_eq!(closest("maxloras", fields), Some("maxLoras"));
        assert_eq!(closest("weight", fields), Some("weights"));
        assert_eq!(closest("zz", fields), None);
        assert_eq!(closest("timeout", fields), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn paths_render_as_written_in_messages() {
        let path = Path::default()
            .field("spec")
            .field("pools")
            .child(Segment::Index(1))
            .field("scheduling");
        assert_eq!(path.to_string(), "spec.pools[1].scheduling");
        let key = Path::default()
            .field("spec")
            .field("objectives")
            .child(Segment::Key("m".into()));
        assert_eq!(key.to_string(), r#"spec.objectives["m"]"#);
    }

    #[test]
    fn places_are_found_in_the_text() {
        let text = "a:\n  b: [1, {c: 2}]\n  d: x\n";
        let path = Path::default()
            .field("a")
            .field("b")
            .child(Segment::Index(1))
            .field("c");
        assert_eq!(locate(text, &Place::Key(path.clone())), Some((2, 11)));
        assert_eq!(locate(text, &Place::Value(path)), Some((2, 14)));
        let d = Path::default().field("a").field("d");
        assert_eq!(locate(text, &Place::Value(d.clone())), Some((3, 6)));
        assert!(matches!(
            scalar_as_written(text, &d, Want::Text),
            Some(Scalar::Text(x)) if x == "x"
        ));
        let first = Path::default()
            .field("a")
            .field("b")
            .child(Segment::Index(0));
        assert!(matches!(
            scalar_as_written(text, &first, Want::Unsigned),
            Some(Scalar::Unsigned(1))
        ));
        assert!(scalar_as_written(text, &d, Want::Unsigned).is_none());
        let nowhere = Path::default().field("a").field("e");
        assert_eq!(locate(text, &Place::Value(nowhere)), None);
    }
}
