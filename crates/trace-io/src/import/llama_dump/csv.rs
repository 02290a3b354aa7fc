//! `llama-csv`: rows `pos,layer,id0,...,id{k-1}`, one per (token, layer).
//!
//! Sequences: a row with a negative position (a prompt token) starts a new sequence when the row
//! before it has a position `>= 0` (generation ended, a new prompt begins), when its position is
//! below every position of the current sequence (a longer prompt), or when it is at the layer of
//! the sequence's first row and that (position, layer) already holds other ids (a prompt as long or
//! shorter). Tokens are ordered by position within their sequence.

use std::collections::HashMap;
use std::path::Path;

use super::{Collected, LlamaDumpOptions, Token, check_ids, finish};
use crate::Result;
use crate::import::{Imported, for_each_line, import_err};

const FORMAT: &str = "llama-csv";

/// Imports the CSV routing dump at `path` (module doc of [`super`] and of this file for the rules).
///
/// # Errors
/// [`TraceError::Import`](crate::TraceError::Import) naming the file and line for: an empty file; a field that is not an
/// integer; a row with a different id count from the header or the first row (mixed k); no ids; a
/// negative layer; an id `< 0`, `>= num_experts` or repeated in its row; a layer recorded twice for
/// one token with different ids; no token routed by every layer. [`TraceError::File`](crate::TraceError::File) around an
/// I/O error.
pub fn import_llama_csv(path: impl AsRef<Path>, opts: &LlamaDumpOptions) -> Result<Imported> {
    let path = path.as_ref();
    if opts.num_experts == 0 {
        return Err(import_err(FORMAT, path, None, "--num-experts 0: a layer has at least one expert".into()));
    }
    let mut p = Parser::new(opts);
    for_each_line(path, |n, line| {
        p.line(n, line).map_err(|m| import_err(FORMAT, path, Some(n), m))?;
        Ok(std::ops::ControlFlow::Continue(()))
    })?;
    p.close_sequence();
    let mut c = p.c;
    if c.tokens.is_empty() {
        let what = if p.header { "a header line and no rows" } else { "no rows: the file is empty" };
        return Err(import_err(FORMAT, path, None, what.into()));
    }
    let (lo, hi) = p.pos_range;
    c.notes.insert(
        0,
        format!(
            "{}; positions {lo}..={hi} (negative: prompt tokens); {} sequences (a new one where a prompt restarts)",
            if p.header { "header line present" } else { "no header line" },
            c.seq_starts.len()
        ),
    );
    finish(FORMAT, path, opts, c)
}

struct Parser<'o> {
    opts: &'o LlamaDumpOptions,
    c: Collected,
    header: bool,
    /// Rows seen (header excluded); the first row fixes k unless the header did.
    started: bool,
    /// The current sequence: its tokens by position, its lowest position, the layer of its first
    /// row, the position of the row before.
    by_pos: HashMap<i64, usize>,
    lowest: i64,
    first_layer: u32,
    prev_pos: Option<i64>,
    /// The line of each row kept.
    row_lines: Vec<usize>,
    pos_range: (i64, i64),
    raw: Vec<i64>,
    ids: Vec<u16>,
}

impl<'o> Parser<'o> {
    fn new(opts: &'o LlamaDumpOptions) -> Self {
        Parser {
            opts,
            c: Collected::default(),
            header: false,
            started: false,
            by_pos: HashMap::new(),
            lowest: 0,
            first_layer: 0,
            prev_pos: None,
            row_lines: Vec::new(),
            pos_range: (0, 0),
            raw: Vec::new(),
            ids: Vec::new(),
        }
    }

    fn line(&mut self, n: usize, line: &str) -> std::result::Result<(), String> {
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if !self.started && !self.header && fields[0].eq_ignore_ascii_case("pos") {
            if fields.len() < 3 {
                return Err(format!("header {line:?}: expected pos,layer,id0,...,id{{k-1}}"));
            }
            self.header = true;
            self.c.k = fields.len() - 2;
            return Ok(());
        }
        let int = |i: usize| -> std::result::Result<i64, String> {
            fields[i].parse::<i64>().map_err(|_| {
                let name = match i {
                    0 => "pos".to_string(),
                    1 => "layer".to_string(),
                    _ => format!("id{}", i - 2),
                };
                format!(
                    "field {} ({name}) {:?} is not an integer; expected pos,layer,id0,...,id{{k-1}}",
                    i + 1,
                    fields[i]
                )
            })
        };
        let pos = int(0)?;
        if fields.len() < 2 {
            return Err(format!("{line:?}: expected pos,layer,id0,...,id{{k-1}}"));
        }
        let layer = int(1)?;
        let layer = u32::try_from(layer).map_err(|_| format!("layer {layer} is not a layer index (0..2^32)"))?;
        if fields.len() == 2 {
            return Err("no expert ids after pos,layer".into());
        }
        let k = fields.len() - 2;
        if self.c.k == 0 {
            self.c.k = k;
        } else if k != self.c.k {
            return Err(format!(
                "{k} ids, but {} has {}: k changes within the file (mixed k)",
                if self.header { "the header" } else { "the first row" },
                self.c.k
            ));
        }
        self.raw.clear();
        for i in 2..fields.len() {
            self.raw.push(int(i)?);
        }
        check_ids(&self.raw, self.opts.num_experts, &mut self.ids)?;
        self.c.records += 1;
        let first = !self.started;
        self.started = true;
        self.pos_range = if first { (pos, pos) } else { (self.pos_range.0.min(pos), self.pos_range.1.max(pos)) };
        // A new sequence where a prompt restarts (module doc).
        let known = self.by_pos.get(&pos).and_then(|&t| self.c.tokens[t].rows.iter().find(|r| r.0 == layer).copied());
        let same = known.is_some_and(|(_, r)| self.c.ids[r as usize * k..][..k] == self.ids[..]);
        let restart = pos < 0
            && (self.prev_pos.is_some_and(|p| p >= 0)
                || pos < self.lowest
                || (layer == self.first_layer && known.is_some() && !same));
        if first || restart {
            self.close_sequence();
            self.c.seq_starts.push(self.c.tokens.len());
            self.lowest = pos;
            self.first_layer = layer;
        } else if let Some((_, r)) = known {
            let at = self.row_lines[r as usize];
            if same {
                if self.c.duplicates.0 == 0 {
                    self.c.duplicates.1 = n;
                }
                self.c.duplicates.0 += 1;
                self.prev_pos = Some(pos);
                return Ok(());
            }
            return Err(format!(
                "layer {layer} recorded twice for the token at position {pos} (line {at} and this line, other ids)"
            ));
        }
        self.prev_pos = Some(pos);
        self.lowest = self.lowest.min(pos);
        let t = match self.by_pos.get(&pos) {
            Some(&t) => t,
            None => {
                self.c.tokens.push(Token { rows: Vec::new(), prefill: pos < 0 });
                self.by_pos.insert(pos, self.c.tokens.len() - 1);
                self.c.tokens.len() - 1
            }
        };
        let r = self.c.push_row(&self.ids);
        self.row_lines.push(n);
        self.c.tokens[t].rows.push((layer, r));
        Ok(())
    }

    /// Orders the current sequence's tokens by position.
    fn close_sequence(&mut self) {
        if let Some(&start) = self.c.seq_starts.last() {
            let mut order: Vec<(i64, usize)> = self.by_pos.iter().map(|(&p, &t)| (p, t)).collect();
            order.sort_unstable();
            let mut taken: Vec<Token> = self.c.tokens.drain(start..).collect();
            for (_, t) in order {
                self.c.tokens.push(std::mem::take(&mut taken[t - start]));
            }
        }
        self.by_pos.clear();
        self.prev_pos = None;
    }
}
