//! Work limits: what a command may cost before it asks for `yes`.

use crate::error::Result;
use crate::usage;

/// Steps (picks plus per-replay expert state, `cachesim::mrc::curve_work`) the curves of one
/// command may cost without `yes`: about a minute.
pub const MAX_CURVE_STEPS: u64 = 4_000_000_000;

/// Refuses `steps` of curve work above [`MAX_CURVE_STEPS`] without `yes`. `narrow`: how the
/// command's own options make the work smaller (`mrc`: `‹caps›`; `plan`: fewer `‹variants›`).
///
/// # Errors
/// [`crate::Error::Usage`] naming the work, the limit and the ways out.
pub fn bound_curves(steps: u64, yes: bool, narrow: &str) -> Result<()> {
    if steps > MAX_CURVE_STEPS && !yes {
        usage!(
            "{steps} steps is above the limit of {MAX_CURVE_STEPS} without ‹yes› (minutes of work or more): {narrow}, \
             use a policy with a one-pass curve (lru, see the mrc command's help), or pass ‹yes› to run it"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_limit_is_inclusive_and_yes_lifts_it() {
        assert!(super::bound_curves(super::MAX_CURVE_STEPS, false, "x").is_ok());
        let e = super::bound_curves(super::MAX_CURVE_STEPS + 1, false, "narrow ‹caps›").unwrap_err();
        assert!(e.to_string().contains("4000000001 steps is above the limit of 4000000000 without yes"), "{e}");
        assert!(super::bound_curves(u64::MAX, true, "x").is_ok());
    }
}
