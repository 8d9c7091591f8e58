//! A YAML document as a plain tree, so that the loader can name every
//! problem itself (an unknown key, a list item that is not a map, a value
//! of the wrong type) the way envoyproxy/ratelimit's loader does, instead
//! of through a derive's generic messages.
//!
//! Parsing is serde-saphyr's (panic-free, with its own limits on depth
//! and aliases); this file only keeps what it visits.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// One YAML value.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// `~`, `null` or nothing.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer that fits in 64 bits.
    Int(i128),
    /// A number with a fraction or an exponent.
    Float(f64),
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
        serde_saphyr::from_str::<Node>(text).map_err(|e| e.to_string())
    }

    /// A scalar as the text a string field takes (YAML's `value: 50` is
    /// the string "50" to envoyproxy/ratelimit, as it is here).
    pub fn as_text(&self) -> Option<String> {
        match self {
            Node::Str(s) => Some(s.clone()),
            Node::Int(i) => Some(i.to_string()),
            Node::Float(f) => Some(f.to_string()),
            Node::Bool(b) => Some(b.to_string()),
            Node::Null => Some(String::new()),
            Node::Seq(_) | Node::Map(_) => None,
        }
    }

    /// What the value is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) => "an integer",
            Node::Float(_) => "a number",
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
            Node::Bool(b) => Value::Bool(*b),
            Node::Int(i) => i64::try_from(*i)
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(*i as f64)),
            Node::Float(f) => serde_json::Number::from_f64(*f)
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
        Ok(Node::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }

    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Node, E> {
        i128::try_from(v)
            .map(Node::Int)
            .map_err(|_| E::custom("integer too large"))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
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
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<Node, Node>()? {
            entries.push((k, v));
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
                (Node::Str("b".into()), Node::Int(1)),
                (
                    Node::Str("a".into()),
                    Node::Seq(vec![
                        Node::Str("x".into()),
                        Node::Float(2.5),
                        Node::Bool(true),
                        Node::Null
                    ])
                ),
            ])
        );
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
