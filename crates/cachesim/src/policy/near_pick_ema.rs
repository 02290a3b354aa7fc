//! `near_pick_ema`: s ← d·s + 1(rank < N in F), a [`Decayed`] policy.

use super::decayed::{Credit, Decayed};
use super::{PolicyFacts, PolicyKind, Shares};
use crate::engine::{Cache, LayerInput, Params};

/// near_pick_ema: x = 1 for the experts at rank < N of F, 0 elsewhere (adding 0 is exact, so
/// adding 1 where x = 1 equals the reference's d·s + x bit for bit).
pub(crate) struct EmaCredit {
    pub(crate) n: usize,
}

impl Credit for EmaCredit {
    fn f_needed(&self) -> usize {
        self.n
    }
    #[inline(always)]
    fn credit(&mut self, cache: &mut Cache<f64>, _t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        add_ones(&f[..f.len().min(self.n)], &mut cache.keys, &cache.pos);
    }
}

/// `keys[pos[e]] += 1` for each expert of `ids`: the credits of near_pick_ema.
#[inline(never)]
pub(crate) fn add_ones(ids: &[u16], keys: &mut [f64], pos: &[u32]) {
    for &e in ids {
        keys[pos[usize::from(e)] as usize] += 1.0;
    }
}

/// near_pick_ema's evictor.
pub(crate) type NearPickEma = Decayed<EmaCredit>;

impl PolicyKind<'_> for NearPickEma {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "near_pick_ema",
        needs_scores: false,
        allows_lambda: true,
        token_indices: false,
        shares: Shares::Scores,
        cost_per_pick: 350,
        cost_per_pick_shared: 310,
    };
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> NearPickEma {
        Decayed::new(params, EmaCredit { n: params.near_n })
    }
}
