//! A YAML document as a plain tree, so that the loader can name every
//! problem itself (an unknown key, a list item that is not a map, a value
//! of the wrong type) the way envoyproxy/ratelimit's loader does, instead
//! of through a derive's generic messages.
//!
//! Parsing is serde-saphyr's (panic-free, with its own limits on depth
//! and aliases); this file only keeps what it visits. A scalar that YAML
//! reads as a boolean or a number keeps its text as written, since a
//! string field takes the text (`value: 1.10` is "1.10", `key: y` is "y",
//! as Go's YAML gives them to envoyproxy/ratelimit).

use std::cell::RefCell;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// One YAML value.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// `~`, `null` or nothing.
    Null,
    /// A boolean (YAML 1.1's spellings: `true`, `yes`, `on`, `y`...), with
    /// its text.
    Bool(bool, String),
    /// An integer, with its text.
    Int(i128, String),
    /// A number with a fraction or an exponent, with its text.
    Float(f64, String),
    /// A string.
    Str(String),
    /// A list.
    Seq(Vec<Node>),
    /// A map, in file order.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Parses `text`; an empty document is [`Node::Null`].
    pub fn parse(text: &str) -> Result<Node, String> {
        if text.trim().is_empty() {
            return Ok(Node::Null);
        }
        SOURCE.with(|source| *source.borrow_mut() = text.to_string());
        let parsed = serde_saphyr::from_str::<Node>(text).map_err(|e| e.to_string());
        SOURCE.with(|source| source.borrow_mut().clear());
        parsed
    }

    /// A scalar as the text a string field takes (YAML's `value: 50` is
    /// the string "50" to envoyproxy/ratelimit, as it is here).
    pub fn as_text(&self) -> Option<String> {
        match self {
            Node::Str(s) => Some(s.clone()),
            Node::Int(_, text) | Node::Float(_, text) | Node::Bool(_, text) => Some(text.clone()),
            Node::Null => Some(String::new()),
            Node::Seq(_) | Node::Map(_) => None,
        }
    }

    /// What the value is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(..) => "a boolean",
            Node::Int(..) => "an integer",
            Node::Float(..) => "a number",
            Node::Str(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a map",
        }
    }

    /// The value as JSON (a descriptor's `metadata`, sent back to Envoy).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Node::Null => Value::Null,
            Node::Bool(b, _) => Value::Bool(*b),
            Node::Int(i, _) => i64::try_from(*i)
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(*i as f64)),
            Node::Float(f, _) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            Node::Str(s) => Value::String(s.clone()),
            Node::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Node::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.as_text().unwrap_or_default(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Seq(_) | Node::Map(_) => write!(f, "{}", self.to_json()),
            scalar => write!(f, "{}", scalar.as_text().unwrap_or_default()),
        }
    }
}

thread_local! {
    /// The text being parsed, for the text of scalars.
    static SOURCE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// `node` with a boolean or number's text taken from the source where it
/// was defined (an alias's anchor).
fn with_source_text(spanned: Spanned<Node>) -> Node {
    let span = spanned.defined.span();
    let text = |text: &mut String| {
        let (Some(at), Some(len)) = (span.byte_offset(), span.byte_len()) else {
            return;
        };
        SOURCE.with(|source| {
            let source = source.borrow();
            let (Ok(at), Ok(len)) = (usize::try_from(at), usize::try_from(len)) else {
                return;
            };
            if let Some(written) = at.checked_add(len).and_then(|end| source.get(at..end)) {
                if !written.is_empty() {
                    *text = written.to_string();
                }
            }
        })
    };
    let mut node = spanned.value;
    match &mut node {
        Node::Bool(_, t) | Node::Int(_, t) | Node::Float(_, t) => text(t),
        _ => {}
    }
    node
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v, v.to_string()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into(), v.to_string()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into(), v.to_string()))
    }

    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v, v.to_string()))
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Node, E> {
        i128::try_from(v)
            .map(|i| Node::Int(i, v.to_string()))
            .map_err(|_| E::custom("integer too large"))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v, v.to_string()))
    }

    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }

    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(with_source_text(item));
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<Spanned<Node>, Spanned<Node>>()? {
            entries.push((with_source_text(k), with_source_text(v)));
        }
        Ok(Node::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_becomes_a_tree_in_file_order() {
        let node = Node::parse("b: 1\na: [x, 2.5, true, ~]\n").unwrap();
        assert_eq!(
            node,
            Node::Map(vec![
                (Node::Str("b".into()), Node::Int(1, "1".into())),
                (
                    Node::Str("a".into()),
                    Node::Seq(vec![
                        Node::Str("x".into()),
                        Node::Float(2.5, "2.5".into()),
                        Node::Bool(true, "true".into()),
                        Node::Null
                    ])
                ),
            ])
        );
    }

    #[test]
    fn booleans_and_numbers_keep_their_text() {
        let node = Node::parse("a: y\nb: 1.10\nc: 0x1F\nd: &n 010\ne: *n\nf: [on, 1e3]\n").unwrap();
        let Node::Map(entries) = node else {
            panic!("a map");
        };
        let texts: Vec<String> = entries[..5].iter().map(|(_, v)| v.to_string()).collect();
        assert_eq!(texts, ["y", "1.10", "0x1F", "010", "010"]);
        let Node::Seq(items) = &entries[5].1 else {
            panic!("a list");
        };
        let texts: Vec<String> = items.iter().map(Node::to_string).collect();
        assert_eq!(texts, ["on", "1e3"]);
        assert!(matches!(entries[0].1, Node::Bool(true, _)));
        assert!(matches!(entries[1].1, Node::Float(..)));
    }

    #[test]
    fn an_empty_document_is_null() {
        assert_eq!(Node::parse("  \n# only a comment\n").unwrap(), Node::Null);
    }

    #[test]
    fn bad_yaml_is_an_error() {
        assert!(Node::parse("a: [1, 2\n").is_err());
    }
}
