//! The table form of the hand-computed tests: a case is a `spec` string (settings, then the
//! rows of the trace) and an `expect` string (`name=value` pairs), parsed here once for the
//! plain, prefetch and deployed tables.
//!
//! `spec` is `SETTINGS | ROWS [| ROWS]`: settings are space-separated words, `key=value` or a
//! bare flag; rows are space-separated rows of comma-separated expert ids, with ` / ` between
//! layers (`0,1 2,3 / 1,2 0,3`: two layers of two rows). A second rows part is a second trace
//! of the same shape (the calibration trace of coact).
//!
//! `expect` is space-separated `name=value` pairs; a value is a number or a comma-separated list
//! of numbers. [`check_expect`] compares only the names given, so a case states what it derived.

use std::str::FromStr;

/// A parsed `spec`: the settings not yet taken, the rows of every layer, and the rows of an
/// optional second trace.
pub struct Spec {
    text: String,
    settings: Vec<(String, String)>,
    /// `layers[l][t]`: the candidate ids of token t in layer l.
    pub layers: Vec<Vec<Vec<u16>>>,
    /// The rows part after a second `|`, in the same form.
    pub second: Option<Vec<Vec<Vec<u16>>>>,
}

/// Comma-separated expert ids.
pub fn ids(list: &str) -> Vec<u16> {
    list.split(',').map(|e| e.parse().unwrap_or_else(|_| panic!("{e:?} is not an expert id"))).collect()
}

fn rows(part: &str) -> Vec<Vec<Vec<u16>>> {
    part.split('/').map(|layer| layer.split_whitespace().map(ids).collect()).collect()
}

impl Spec {
    /// Parses `SETTINGS | ROWS [| ROWS]`.
    pub fn parse(text: &str) -> Spec {
        let mut parts = text.split('|');
        let settings = parts.next().unwrap_or_default();
        let layers = rows(parts.next().unwrap_or_else(|| panic!("{text}: settings | rows")));
        let second = parts.next().map(rows);
        assert!(parts.next().is_none(), "{text}: at most two rows parts");
        let settings = settings
            .split_whitespace()
            .map(|w| {
                let (k, v) = w.split_once('=').unwrap_or((w, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        Spec { text: text.to_string(), settings, layers, second }
    }

    /// Takes the value of `key=value`, if given.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let i = self.settings.iter().position(|(k, _)| k == key)?;
        Some(self.settings.remove(i).1)
    }

    /// Takes the number of `key=N`, if given.
    pub fn num<T: FromStr>(&mut self, key: &str) -> Option<T> {
        let text = self.text.clone();
        self.take(key).map(|v| v.parse().unwrap_or_else(|_| panic!("{text}: {key}={v} is not a number")))
    }

    /// Takes the number of `key=N`, which the case must give.
    pub fn need<T: FromStr>(&mut self, key: &str) -> T {
        let text = self.text.clone();
        self.num(key).unwrap_or_else(|| panic!("{text}: needs {key}="))
    }

    /// Takes the bare flag `key`; whether it was given.
    pub fn flag(&mut self, key: &str) -> bool {
        self.take(key).is_some()
    }

    /// Takes the first bare word that parses as a `T` (a policy or predictor name).
    pub fn word<T: FromStr>(&mut self) -> Option<T> {
        let i = self.settings.iter().position(|(k, v)| v.is_empty() && k.parse::<T>().is_ok())?;
        self.settings.remove(i).0.parse().ok()
    }

    /// The flattened ids of every layer (layer-major), the token count T and the row width m;
    /// every layer must have T rows of m ids.
    pub fn ids(&self) -> (Vec<u16>, usize, usize) {
        flatten(&self.text, &self.layers)
    }

    /// As [`Spec::ids`] for the second rows part.
    pub fn second_ids(&self) -> Option<(Vec<u16>, usize, usize)> {
        self.second.as_ref().map(|s| flatten(&self.text, s))
    }

    /// The spec's text, for messages.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Asserts every setting was taken (a misspelt one is an error, not ignored).
    pub fn finish(&self) {
        assert!(self.settings.is_empty(), "{}: unknown settings {:?}", self.text, self.settings);
    }
}

fn flatten(text: &str, layers: &[Vec<Vec<u16>>]) -> (Vec<u16>, usize, usize) {
    let (tokens, m) = (layers[0].len(), layers[0][0].len());
    for layer in layers {
        assert_eq!(layer.len(), tokens, "{text}: every layer has the same number of rows");
        assert!(layer.iter().all(|r| r.len() == m), "{text}: every row has the same width");
    }
    (layers.iter().flatten().flatten().copied().collect(), tokens, m)
}

/// Asserts that every `name=value` of `expect` matches the figure of that name in `got`
/// (within a relative 1e-12, so counts compare exactly and derived ratios as written to 13
/// digits); a name not in `got` is an error.
pub fn check_expect(spec: &str, expect: &str, got: &[(&str, Vec<f64>)]) {
    for pair in expect.split_whitespace() {
        let (name, value) = pair.split_once('=').unwrap_or_else(|| panic!("{expect}: {pair} is not name=value"));
        let want: Vec<f64> =
            value.split(',').map(|x| x.parse().unwrap_or_else(|_| panic!("{expect}: {x} is not a number"))).collect();
        let have = &got
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{expect}: no figure {name}; figures are {:?}", names(got)))
            .1;
        let close =
            have.len() == want.len() && have.iter().zip(&want).all(|(h, w)| (h - w).abs() <= 1e-12 * w.abs().max(1.0));
        assert!(close, "{spec}: {name} is {have:?}, expected {want:?}");
    }
}

fn names<'a>(got: &'a [(&'a str, Vec<f64>)]) -> Vec<&'a str> {
    got.iter().map(|(n, _)| *n).collect()
}

/// A count as a figure.
pub fn n(x: u64) -> Vec<f64> {
    vec![x as f64]
}

/// A list of counts as a figure.
pub fn list(xs: &[u64]) -> Vec<f64> {
    xs.iter().map(|&x| x as f64).collect()
}
