//! What people write as an object is read as an object only.
//!
//! serde's derived `Deserialize` for a struct takes a JSON array as well,
//! its fields by position: `["seqq", null, 7]` reads as a quota named
//! `seqq` with limit 7, and `[1, 2]` as a limiter configuration. Nobody
//! means that, and a body or a configuration that is not an object is
//! most likely something else sent to the wrong place. [`Object`] reads
//! a value only from a JSON object (a map) and refuses anything else,
//! naming what it expected; [`objects`] does the same for each element of
//! a list field.
//!
//! Used wherever people's JSON meets a struct: the admin API's bodies,
//! the sync request, quota files' overrides and `sluice_init`'s
//! configuration.

use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A `T` read from an object only (an array is refused, not read by
/// position).
#[derive(Clone, Debug, PartialEq)]
pub struct Object<T>(pub T);

impl<T> Object<T> {
    /// The value read.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_map(MapOnly(PhantomData)).map(Object)
    }
}

/// Takes a map and hands it to `T`'s own deserializer; the default of
/// every other `visit_*` refuses the value, saying what was expected.
struct MapOnly<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object ({\"field\": value, ...}), not a list of values")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

/// A list of objects, each read as [`Object`] reads one: for
/// `#[serde(deserialize_with = "...")]` on a `Vec<T>` field.
pub fn objects<'de, D, T>(de: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let list = Vec::<Object<T>>::deserialize(de)?;
    Ok(list.into_iter().map(Object::into_inner).collect())
}

/// An object, or `null`, read as [`Object`] reads one: for
/// `#[serde(deserialize_with = "...")]` on an `Option<T>` field.
pub fn optional_object<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let value = Option::<Object<T>>::deserialize(de)?;
    Ok(value.map(Object::into_inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Pair {
        name: String,
        #[serde(default)]
        limit: Option<f64>,
        #[serde(default, deserialize_with = "objects")]
        parts: Vec<Pair>,
    }

    fn read(json: &str) -> Result<Pair, String> {
        serde_json::from_str::<Object<Pair>>(json)
            .map(Object::into_inner)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn an_object_reads_as_the_derived_struct_reads_it() {
        let pair = read(r#"{"name": "a", "limit": 7}"#).unwrap();
        assert_eq!(pair.name, "a");
        assert_eq!(pair.limit, Some(7.0));
        let nested = read(r#"{"name": "a", "parts": [{"name": "b"}]}"#).unwrap();
        assert_eq!(nested.parts[0].name, "b");
        let unknown = read(r#"{"name": "a", "limt": 7}"#).unwrap_err();
        assert!(unknown.contains("unknown field `limt`"), "{unknown}");
        let missing = read(r#"{"limit": 7}"#).unwrap_err();
        assert!(missing.contains("missing field `name`"), "{missing}");
    }

    #[test]
    fn arrays_and_other_values_are_refused_naming_an_object() {
        // What the derived struct alone takes.
        let positional: Pair = serde_json::from_str(r#"["a", 7, []]"#).unwrap();
        assert_eq!(positional.limit, Some(7.0));
        for bad in [r#"["a", 7, []]"#, "[]", "7", r#""a""#, "null", "true"] {
            let error = read(bad).unwrap_err();
            assert!(error.contains("expected a JSON object"), "{bad}: {error}");
        }
        let inner = read(r#"{"name": "a", "parts": [["b"]]}"#).unwrap_err();
        assert!(inner.contains("expected a JSON object"), "{inner}");
    }

    #[test]
    fn an_optional_object_is_null_or_an_object() {
        #[derive(Debug, Deserialize)]
        struct Holder {
            #[serde(default, deserialize_with = "optional_object")]
            inner: Option<Pair>,
        }
        let read = |json: &str| serde_json::from_str::<Holder>(json).map_err(|e| e.to_string());
        assert!(read("{}").unwrap().inner.is_none());
        assert!(read(r#"{"inner": null}"#).unwrap().inner.is_none());
        assert_eq!(
            read(r#"{"inner": {"name": "x"}}"#)
                .unwrap()
                .inner
                .unwrap()
                .name,
            "x"
        );
        assert!(read(r#"{"inner": ["x"]}"#)
            .unwrap_err()
            .contains("expected a JSON object"));
    }
}
