//! Replaying a plan's caps under the plan's own settings.

use cachesim::ReplayConfig;
use saliency::KeepMap;

use super::ReplayRequest;
use crate::error::Result;
use crate::inputs::PlanSettings;
use crate::usage;

/// Refuses to replay a plan's caps under settings other than the plan's own: the figures would
/// silently differ from the ones the plan printed. Compares the plan's recorded policy, k_used,
/// warmup and keep map (`map`: this replay's, `None` for every expert kept; `top_k`: the trace's,
/// the default k_used), and the settings `plan` leaves at their defaults; names each difference
/// and the option that restores the plan's.
pub(super) fn check(
    path: &str,
    plan: &PlanSettings,
    r: &ReplayRequest,
    top_k: usize,
    map: Option<&KeepMap>,
) -> Result<()> {
    let mut diffs = Vec::new();
    let mut fixes = Vec::new();
    let mut differs = |diff: String, fix: String| {
        diffs.push(diff);
        fixes.push(fix);
    };
    let policy = r.policy.to_string();
    if plan.policy != policy {
        differs(format!("policy {} (here {policy})", plan.policy), format!("‹policy={}›", plan.policy));
    }
    let k_used = r.k_used.unwrap_or(top_k);
    if let Some(k) = plan.k_used.filter(|&k| k != k_used) {
        differs(format!("k_used {k} (here {k_used})"), format!("‹k_used={k}›"));
    }
    if let Some(w) = plan.warmup.filter(|&w| w != r.warmup) {
        differs(format!("warmup {w} (here {})", r.warmup), format!("‹warmup={w}›"));
    }
    let variant = map.map_or_else(|| "full".to_string(), KeepMap::label);
    let other_map = match (&plan.keep_layers, map) {
        (Some(p), Some(m)) => *p != m.layers,
        _ => plan.variant != variant,
    };
    if other_map {
        // A plan written before plans recorded their keep map names it only.
        let fix = match plan.keep_layers {
            Some(_) => format!("‹keep={path}›"),
            None => format!("‹keep› with the keep map {}", plan.variant),
        };
        differs(format!("keep map {} (here {variant})", plan.variant), fix);
    }
    // `plan` replays with the defaults of everything else.
    let d = ReplayConfig::new(r.policy, 1);
    if r.lambda != d.lambda {
        differs(format!("lambda {} (here {})", d.lambda, r.lambda), format!("‹lambda={}›", d.lambda));
    }
    if r.decay != d.decay {
        differs(format!("decay {} (here {})", d.decay, r.decay), format!("‹decay={}›", d.decay));
    }
    if r.near_pick_n != d.near_pick_n {
        let (n, here) = (d.near_pick_n, r.near_pick_n);
        differs(format!("near_pick_n {n} (here {here})"), format!("‹near_pick_n={n}›"));
    }
    if r.semantics != d.semantics {
        let (sem, here) = (d.semantics, r.semantics);
        differs(format!("semantics {sem} (here {here})"), format!("‹semantics={sem}›"));
    }
    if r.reset_at_sequence {
        differs("no reset at sequence starts (here one)".into(), "(and drop ‹reset_at_sequence›)".into());
    }
    if diffs.is_empty() {
        return Ok(());
    }
    usage!(
        "‹layer_caps› {path} is a plan made with {}: its caps replayed otherwise would not give the plan's figures. \
         To verify the plan add {}; to replay its caps under other settings, give them as a list (‹layer_caps=8,6,...›)",
        diffs.join(", "),
        fixes.join(" ")
    )
}
