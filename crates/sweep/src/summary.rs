//! The summary table of a sweep: per (variant, cap), the best online policy chosen in sample,
//! what it gives out of sample, the out-of-sample best, and Belady. One model, two renderings:
//! `summary.md` ([`SummaryTable::markdown`]) and the HTML report (which reads
//! [`SummaryTable::columns`] and [`SummaryTable::rows`]).

use crate::SweepOutput;

/// The paragraph above the table in `summary.md` (what the figures mean).
pub const SUMMARY_INTRO: &str = "Misses per token (lower is better); configurations as policy/lambda/j. Belady is the offline optimum for the requests of λ = 0 routing: a lower bound of every λ = 0 online policy when every token counts (warmup 0); counted from the warmup it may exceed one by up to the cap per layer. Cache-aware routing (λ > 0) changes the requests, so a λ > 0 configuration can beat it. The in-sample choice is the best online configuration on the in-sample trace; `out-of-sample (in-sample choice)` is what that configuration gives on the out-of-sample trace, `shift` the difference.";

/// One column of the summary table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Header text.
    pub name: &'static str,
    /// A figure (right-aligned) rather than a label.
    pub numeric: bool,
}

/// The columns, in order.
pub const SUMMARY_COLUMNS: [Column; 9] = [
    Column { name: "variant", numeric: false },
    Column { name: "cap", numeric: true },
    Column { name: "best online in-sample", numeric: false },
    Column { name: "in-sample", numeric: true },
    Column { name: "out-of-sample (in-sample choice)", numeric: true },
    Column { name: "shift", numeric: true },
    Column { name: "best online out-of-sample", numeric: false },
    Column { name: "out-of-sample (best)", numeric: true },
    Column { name: "Belady in / out", numeric: false },
];

/// The summary table: formatted cells, one row per (variant, cap, k_used) of
/// [`SweepOutput::best_per_variant`].
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryTable {
    /// [`SUMMARY_COLUMNS`].
    pub columns: &'static [Column],
    /// Cells, `[rows][columns]`: misses per token with 4 decimals, the shift signed; a variant
    /// cell names its `k_used` when the grid has several; a cap cell is `caps:NAME` for per-layer
    /// caps; `-` where the grid has no Belady.
    pub rows: Vec<Vec<String>>,
}

impl SummaryTable {
    /// The table of `output`'s rows.
    pub fn of(output: &SweepOutput) -> SummaryTable {
        let best = output.best_per_variant();
        // With several k_used in the grid, the variant cell says which one (rows would collide).
        let several_k = best.iter().any(|b| b.k_used != best[0].k_used);
        let rows = best
            .iter()
            .map(|b| {
                let variant =
                    if several_k { format!("{} (k_used {})", b.variant, b.k_used) } else { b.variant.clone() };
                vec![
                    variant,
                    b.layer_caps.as_ref().map_or_else(|| b.cap.to_string(), |n| format!("caps:{n}")),
                    b.in_sample_best.clone(),
                    format!("{:.4}", b.in_sample_misses_per_token),
                    format!("{:.4}", b.chosen_out_of_sample),
                    format!("{:+.4}", b.shift()),
                    b.out_of_sample_best.clone(),
                    format!("{:.4}", b.out_of_sample_misses_per_token),
                    b.belady.map_or("-".to_string(), |(i, o)| format!("{i:.4} / {o:.4}")),
                ]
            })
            .collect();
        SummaryTable { columns: &SUMMARY_COLUMNS, rows }
    }

    /// The table as Markdown (figures right-aligned), one line per row.
    pub fn markdown(&self) -> String {
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            cells.fold(String::from("|"), |mut s, c| {
                s.push(' ');
                s.push_str(c);
                s.push_str(" |");
                s
            }) + "\n"
        };
        let mut s = line(&mut self.columns.iter().map(|c| c.name));
        s += &self.columns.iter().fold(String::from("|"), |s, c| s + if c.numeric { "---:|" } else { "---|" });
        s += "\n";
        for row in &self.rows {
            s += &line(&mut row.iter().map(String::as_str));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_aligns_figures_right() {
        let t = SummaryTable {
            columns: &SUMMARY_COLUMNS[..3],
            rows: vec![vec!["full".into(), "8".into(), "lru/0/1".into()]],
        };
        assert_eq!(t.markdown(), "| variant | cap | best online in-sample |\n|---|---:|---|\n| full | 8 | lru/0/1 |\n");
    }
}
