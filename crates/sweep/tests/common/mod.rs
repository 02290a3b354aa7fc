//! Helpers shared by the sweep crate's integration tests.

#![allow(dead_code, reason = "each test file uses a different subset")]

use sweep::TraceInput;
use trace_io::TraceData;
use trace_io::synth::{SynthConfig, generate};

/// An in-sample (400 tokens, 6 sequences) and an out-of-sample (300 tokens, 5 sequences)
/// synthetic trace of one model: `layers` layers, 16 experts, top-2 of 4 candidates.
pub fn traces(layers: usize) -> (TraceData, TraceData) {
    let base = SynthConfig { layers, experts: 16, top_k: 2, candidates: 4, model_seed: 5, ..Default::default() };
    let a = generate(&SynthConfig { tokens: 400, sequences: 6, seed: 1, ..base.clone() }).unwrap();
    let b = generate(&SynthConfig { tokens: 300, sequences: 5, seed: 2, ..base }).unwrap();
    (a, b)
}

/// `t` as a sweep input named `name` (digest "0").
pub fn input<'a>(t: &'a TraceData, name: &'a str) -> TraceInput<'a> {
    TraceInput { view: t.view(), source: name, digest: "0" }
}
