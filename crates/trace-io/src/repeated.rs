//! Repeated keys in a JSON object. `serde_json` keeps only the last value of a key written
//! twice, so a reader that must not lose one without a word asks here first: count files (a
//! layer twice), device profiles (a field twice) and the trace header (a tensor or a metadata
//! key twice).

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The first key that appears twice at the top level of the JSON object in `bytes`, or `None`
/// (no repeat, or not a JSON object: that is left to the caller's parser and its message).
pub fn repeated_top_key(bytes: &[u8]) -> Option<String> {
    serde_json::Deserializer::from_slice(bytes).deserialize_map(Keys { inner: None }).ok().flatten().map(|r| r.key)
}

/// A key written twice, found by [`repeated_header_key`].
#[derive(Debug, PartialEq)]
pub(crate) struct Repeated {
    /// The key of the top-level object whose value holds the repeat, `None` for the top level.
    pub within: Option<String>,
    /// The repeated key.
    pub key: String,
}

/// The first repeated key of a safetensors header: a top-level key (a tensor entry, or
/// `__metadata__`) or a key inside `__metadata__`.
pub(crate) fn repeated_header_key(header: &[u8]) -> Option<Repeated> {
    serde_json::Deserializer::from_slice(header).deserialize_map(Keys { inner: Some("__metadata__") }).ok().flatten()
}

/// The visitor of one object: its keys, and, for the key `inner`, the keys of its value (when
/// that is an object).
struct Keys {
    inner: Option<&'static str>,
}

impl<'de> Visitor<'de> for Keys {
    type Value = Option<Repeated>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Repeated>, A::Error> {
        let mut seen = std::collections::HashSet::new();
        let mut repeated = None;
        while let Some(key) = map.next_key::<String>()? {
            if self.inner == Some(key.as_str()) {
                let found = map.next_value_seed(Inner)?;
                if repeated.is_none() {
                    repeated = found.map(|k| Repeated { within: Some(key.clone()), key: k });
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
            if repeated.is_none() && !seen.insert(key.clone()) {
                repeated = Some(Repeated { within: None, key });
            }
        }
        Ok(repeated)
    }
}

/// The value of the inner key: the first repeated key when it is an object, `None` for any
/// other value.
struct Inner;

impl<'de> DeserializeSeed<'de> for Inner {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Inner {
    type Value = Option<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<String>, A::Error> {
        Keys { inner: None }.visit_map(map).map(|r| r.map(|r| r.key))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Option<String>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<String>, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_top_keys_are_found() {
        // (JSON text, the repeated key)
        let cases = [
            (r#"{"0": [1, 2], "0": [3, 4]}"#, Some("0")),
            (r#"{"0": [1, 2], "1": [3, 4], "1": []}"#, Some("1")),
            (r#"{"0": {"a": 1, "a": 2}, "1": [3, 4]}"#, None),
            (r#"{"0": [1, 2], "1": [3, 4]}"#, None),
            ("[1, 2, 3]", None),
            ("not json", None),
        ];
        for (text, want) in cases {
            assert_eq!(repeated_top_key(text.as_bytes()).as_deref(), want, "{text}");
        }
    }

    #[test]
    fn repeated_header_keys_are_found() {
        let r = |within: Option<&str>, key: &str| Some(Repeated { within: within.map(String::from), key: key.into() });
        // (header text, the repeat)
        let cases = [
            (r#"{"ids": {"a": 1}, "ids": {"a": 2}}"#, r(None, "ids")),
            (
                r#"{"__metadata__": {"model": "a", "top_k": "2", "model": "b"}, "ids": {}}"#,
                r(Some("__metadata__"), "model"),
            ),
            (r#"{"__metadata__": {"model": "a"}, "__metadata__": {}}"#, r(None, "__metadata__")),
            (r#"{"__metadata__": {"model": "a"}, "ids": {"x": 1, "x": 2}}"#, None),
            (r#"{"__metadata__": [1, {"a": 1, "a": 2}], "ids": 3}"#, None),
            (r#"{"__metadata__": {"model": "a"}, "ids": {}}"#, None),
            ("not json", None),
        ];
        for (text, want) in cases {
            assert_eq!(repeated_header_key(text.as_bytes()), want, "{text}");
        }
    }
}
