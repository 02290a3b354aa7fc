//! Importer for the ESFT expert-score layout (DeepSeek-V2-Lite routing, one file per domain and layer).
//!
//! Input: `DIR/results/expert_scores/<domain>/expert_weights_<layer>.txt` (DIR may also be the
//! `expert_scores` directory itself). Each line is one sequence: the token-major ids `[seq_len, k]`,
//! tab-separated, an empty field, then the matching full-softmax probabilities `[seq_len, k]`
//! rounded to 4 decimals. Line n of every layer file of a domain is the same sequence.
//!
//! Output: one trace, domains concatenated in the order given, sequences in file order, with
//! - rows sorted by (probability desc, id asc), since the files do not order them;
//! - `scores = ln(p)` (`score_kind = log_probs`: logits up to a per-row constant); probabilities
//!   that read 0.0000 after rounding are floored at half the rounding unit and counted in the
//!   metadata key `floored_probs`;
//! - `gates = p` as recorded (not renormalized; a file whose rows all sum to 1 is detected as
//!   renormalized and gets `score_kind = log_probs_renormalized`);
//! - `seq_offsets` at every sequence start; `m = k` (no candidates beyond the used ones).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{ImportReport, Imported};
use crate::{OwnedParts, Phase, Result, ScoreKind, TraceData, TraceError, TraceMeta};

/// Probabilities recorded as 0 (ESFT's 0.0000) are floored here before `ln`: half the 4-decimal
/// rounding unit. Non-zero probabilities, however small, are kept as they are.
pub const PROB_FLOOR: f32 = 0.00005;

/// The four domains of the ESFT release, in their default concatenation order.
pub const DOMAINS: [&str; 4] = ["intent", "law", "summary", "translation"];

/// Options of [`import_esft`].
#[derive(Debug, Clone)]
pub struct EsftOptions {
    /// Domains to read, concatenated in this order. Default: all four, in [`DOMAINS`] order.
    pub domains: Vec<String>,
    /// Routed experts per layer (E). Default 64 (DeepSeek-V2-Lite).
    pub num_experts: u32,
    /// Experts per token (k): the row width. Default 6.
    pub top_k: u32,
    /// Model name recorded in the metadata.
    pub model: String,
}

impl Default for EsftOptions {
    fn default() -> Self {
        EsftOptions {
            domains: DOMAINS.iter().map(|s| s.to_string()).collect(),
            num_experts: 64,
            top_k: 6,
            model: "deepseek-ai/ESFT-vanilla-lite (DeepSeek-V2-Lite shape)".into(),
        }
    }
}

/// One parsed layer file: rows of (id, prob) and sequence lengths.
struct LayerFile {
    rows: Vec<(u16, f32)>,
    seq_lens: Vec<usize>,
    /// The 1-based line of each sequence.
    seq_lines: Vec<usize>,
}

/// Imports one or more ESFT domains into one trace.
///
/// # Errors
/// [`TraceError::Import`] naming the file and line for a missing directory, no layer files, a
/// layer file missing between the lowest and highest layer found (a gap in the layer ids), a line
/// without the empty separator field, unequal id and probability counts, a count not divisible by
/// k, an unparsable number, an id `>= num_experts`, an id repeated within a row, or layer files
/// of one domain that disagree on sequence count or lengths; [`TraceError::Config`] for
/// `num_experts` outside `1..=65536`.
pub fn import_esft(dir: impl AsRef<Path>, opts: &EsftOptions) -> Result<TraceData> {
    import_esft_with_report(dir, opts).map(|i| i.trace)
}

/// [`import_esft`], plus the report of what was read (records = (layer, token) rows over all
/// files; nothing is dropped by this importer).
///
/// # Errors
/// As [`import_esft`].
pub fn import_esft_with_report(dir: impl AsRef<Path>, opts: &EsftOptions) -> Result<Imported> {
    let dir = dir.as_ref();
    if opts.domains.is_empty() {
        return Err(TraceError::Config { key: "domains", reason: "at least one domain is needed".into() });
    }
    if opts.top_k == 0 {
        return Err(TraceError::Config { key: "top_k", reason: "must be at least 1".into() });
    }
    if opts.num_experts == 0 || opts.num_experts > u32::from(u16::MAX) + 1 {
        return Err(TraceError::Config {
            key: "num_experts",
            reason: format!("{} is not in 1..=65536", opts.num_experts),
        });
    }
    let k = opts.top_k as usize;
    if !dir.is_dir() {
        let what = match std::fs::metadata(dir) {
            Ok(m) if m.is_file() => "is a file, not a directory",
            Ok(_) => "is not a directory",
            Err(_) => "is missing",
        };
        return Err(TraceError::Config {
            key: "dir",
            reason: format!(
                "{} {what}: give the ESFT expert_scores directory, which holds a directory of \
                 expert_weights_<layer>.txt files per domain (the real data: `cargo xtask fetch-real-data`, README \"Real data\")",
                dir.display()
            ),
        });
    }
    let root =
        if dir.join("results/expert_scores").is_dir() { dir.join("results/expert_scores") } else { dir.to_path_buf() };

    let mut layer_ids: Option<Vec<u32>> = None;
    // per layer, per domain parsed files
    let mut per_layer: Vec<Vec<LayerFile>> = Vec::new();
    let mut seqs_per_domain = Vec::new();
    // An empty name (a trailing comma in --domains) is refused before any domain is read.
    if opts.domains.iter().any(String::is_empty) {
        return Err(TraceError::Config {
            key: "domains",
            reason: "an empty domain name (a trailing or doubled comma?): give names such as translation,law".into(),
        });
    }
    for domain in &opts.domains {
        let ddir = root.join(domain);
        if ddir.exists() && !ddir.is_dir() {
            return Err(TraceError::Config {
                key: "domains",
                reason: format!(
                    "{} is a file, not a directory: a domain is a directory of expert_weights_<layer>.txt files",
                    ddir.display()
                ),
            });
        }
        if !ddir.is_dir() {
            return Err(TraceError::Config {
                key: "domains",
                reason: format!("no domain {domain:?} in {}; it has: {}", root.display(), domain_names(&root)),
            });
        }
        let files = layer_files(&ddir)?;
        let ids: Vec<u32> = files.iter().map(|(l, _)| *l).collect();
        if let Some((first, missing)) = super::missing_layers(&ids) {
            return Err(import_err(
                &ddir,
                None,
                format!(
                    "no layer file for {missing} (expert_weights_{first}.txt), between layers {} and {}: \
                     every MoE layer of the model is logged, so a gap means a lost file",
                    ids[0],
                    ids[ids.len() - 1]
                ),
            ));
        }
        match &layer_ids {
            None => {
                per_layer = (0..ids.len()).map(|_| Vec::new()).collect();
                layer_ids = Some(ids);
            }
            Some(prev) if *prev != ids => {
                return Err(import_err(
                    &ddir,
                    None,
                    format!(
                        "layers {ids:?} differ from the first domain's {prev:?}: give domains of one model and run"
                    ),
                ));
            }
            Some(_) => {}
        }
        let mut domain_lens: Option<(PathBuf, Vec<usize>, Vec<usize>)> = None;
        for (li, (_, path)) in files.iter().enumerate() {
            let lf = parse_layer_file(path, k, opts.num_experts)?;
            match &domain_lens {
                None => domain_lens = Some((path.clone(), lf.seq_lens.clone(), lf.seq_lines.clone())),
                Some((first, lens, lines)) if *lens != lf.seq_lens => {
                    // The first sequence that differs, with its line in both files.
                    let i = lens
                        .iter()
                        .zip(&lf.seq_lens)
                        .position(|(a, b)| a != b)
                        .unwrap_or(lens.len().min(lf.seq_lens.len()));
                    let line = lf.seq_lines.get(i).copied();
                    let what = match (lens.get(i), lf.seq_lens.get(i)) {
                        (Some(a), Some(b)) => {
                            format!("sequence {i} has {b} tokens, {a} at line {} of {}", lines[i], first.display())
                        }
                        _ => format!("{} sequences, {} in {}", lf.seq_lens.len(), lens.len(), first.display()),
                    };
                    return Err(import_err(
                        path,
                        line.filter(|_| i < lf.seq_lens.len()),
                        format!(
                            "sequence lengths differ from the domain's first layer file: {what} ({} vs {} tokens in all)",
                            lf.seq_lens.iter().sum::<usize>(),
                            lens.iter().sum::<usize>()
                        ),
                    ));
                }
                Some(_) => {}
            }
            per_layer[li].push(lf);
        }
        let lens = domain_lens.map(|d| d.1).unwrap_or_default();
        seqs_per_domain.push((domain.clone(), lens));
    }
    let layer_ids = layer_ids.unwrap_or_default();

    let tokens: usize = seqs_per_domain.iter().flat_map(|(_, l)| l.iter()).sum();
    let n_layers = layer_ids.len();
    let mut ids = Vec::with_capacity(n_layers * tokens * k);
    let mut scores = Vec::with_capacity(n_layers * tokens * k);
    let mut gates = Vec::with_capacity(n_layers * tokens * k);
    let mut floored = 0u64;
    let (mut rows, mut rows_summing_to_one) = (0u64, 0u64);
    let mut row: Vec<(u16, f32)> = Vec::with_capacity(k);
    for files in &per_layer {
        for lf in files {
            for chunk in lf.rows.chunks_exact(k) {
                row.clear();
                row.extend_from_slice(chunk);
                row.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let mut sum = 0.0f64;
                for &(id, p) in &row {
                    ids.push(id);
                    gates.push(p);
                    sum += f64::from(p);
                    // Only a value recorded as 0 is floored (the 4-decimal rounding made it 0).
                    if p == 0.0 {
                        floored += 1;
                        scores.push(PROB_FLOOR.ln());
                    } else {
                        scores.push(p.ln());
                    }
                }
                rows += 1;
                if (sum - 1.0).abs() <= super::RENORM_TOLERANCE {
                    rows_summing_to_one += 1;
                }
            }
        }
    }
    // Renormalization is detected: the released files are not renormalized (a row sums to about
    // 0.3-0.45), and their metadata stays as it always was; a renormalized export says so.
    let renormalized = rows > 0 && rows_summing_to_one == rows;
    let mut seq_offsets = Vec::new();
    let mut start = 0u64;
    for (_, lens) in &seqs_per_domain {
        for &len in lens {
            seq_offsets.push(start);
            start += len as u64;
        }
    }
    let n_seqs = seq_offsets.len();
    let mut extra = BTreeMap::new();
    extra.insert("domains".to_string(), opts.domains.join(","));
    extra.insert(
        "domain_tokens".to_string(),
        seqs_per_domain.iter().map(|(d, l)| format!("{d}:{}", l.iter().sum::<usize>())).collect::<Vec<_>>().join(","),
    );
    extra.insert("prob_floor".to_string(), PROB_FLOOR.to_string());
    extra.insert("floored_probs".to_string(), floored.to_string());
    let score_kind = if renormalized {
        extra.insert("renormalized".to_string(), format!("true: every row's probabilities sum to 1 (top-{k})"));
        extra.insert("gates".to_string(), format!("probabilities renormalized over the {k} used experts"));
        ScoreKind::LogProbsRenormalized
    } else {
        extra.insert(
            "gates".to_string(),
            "full-softmax probabilities of the used experts, not renormalized".to_string(),
        );
        ScoreKind::LogProbs
    };
    let meta = TraceMeta {
        model: opts.model.clone(),
        num_experts: opts.num_experts,
        top_k: opts.top_k,
        layer_ids,
        score_kind,
        phase: Phase::Prefill,
        source: format!("esft expert_scores: {}", opts.domains.join(",")),
        extra,
    };
    let parts = OwnedParts {
        ids,
        scores: Some(scores),
        gates: Some(gates),
        out_norms: None,
        seq_offsets: Some(seq_offsets),
        step_offsets: None,
    };
    let trace = TraceData::new(meta, tokens, k, parts).map_err(|e| e.in_file(&root))?;
    let report = ImportReport {
        format: "esft",
        files: n_layers * opts.domains.len(),
        records_read: (n_layers * tokens) as u64,
        layers: n_layers,
        tokens,
        sequences: Some(n_seqs),
        steps: None,
        floored_probs: floored,
        dropped: Vec::new(),
        notes: Vec::new(),
        warnings: Vec::new(),
    };
    Ok(Imported { trace, report })
}

/// The subdirectories of `root` (the domains), sorted and comma-separated, or a note that it has none.
fn domain_names(root: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        "no domain directory at all (is it the ESFT expert_scores directory?)".into()
    } else {
        names.join(", ")
    }
}

/// Lists `expert_weights_<layer>.txt` in `dir`, sorted by layer.
fn layer_files(dir: &Path) -> Result<Vec<(u32, PathBuf)>> {
    let rd =
        std::fs::read_dir(dir).map_err(|e| import_err(dir, None, format!("cannot read the domain directory: {e}")))?;
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| TraceError::Io(e).in_file(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(layer) = name.strip_prefix("expert_weights_").and_then(|s| s.strip_suffix(".txt")) {
            let layer: u32 =
                layer.parse().map_err(|_| import_err(&entry.path(), None, "layer number is not an integer".into()))?;
            out.push((layer, entry.path()));
        }
    }
    if out.is_empty() {
        return Err(import_err(
            dir,
            None,
            "no expert_weights_<layer>.txt files: give the esft-dsv2lite directory or its results/expert_scores".into(),
        ));
    }
    out.sort();
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(import_err(
            &w[1].1,
            None,
            format!("is also layer {} ({}): keep one file per layer", w[0].0, w[0].1.display()),
        ));
    }
    Ok(out)
}

/// Parses one layer file, checking every number and every row (ids `< num_experts`, no id twice
/// in a row) so that errors name the file, the line and the field.
fn parse_layer_file(path: &Path, k: usize, num_experts: u32) -> Result<LayerFile> {
    let text = crate::read_regular_to_string(path).map_err(|e| TraceError::Io(e).in_file(path))?;
    let mut rows = Vec::new();
    let mut seq_lens = Vec::new();
    let mut seq_lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // A trailing tab or space (an editor's, a spreadsheet's) is no empty field.
        let line = line.trim_end_matches(['\r', '\t', ' ']);
        if line.is_empty() {
            continue;
        }
        let err = |msg: String| import_err(path, Some(n + 1), msg);
        let fields: Vec<&str> = line.split('\t').collect();
        let sep = fields
            .iter()
            .position(|f| f.is_empty())
            .ok_or_else(|| err("no empty field between ids and probabilities: a line is the ids, an empty field (two tabs), then the probabilities".into()))?;
        let (id_f, prob_f) = (&fields[..sep], &fields[sep + 1..]);
        if id_f.len() != prob_f.len() {
            return Err(err(format!(
                "{} ids but {} probabilities: a line holds one probability per id",
                id_f.len(),
                prob_f.len()
            )));
        }
        if id_f.len() % k != 0 {
            return Err(err(format!(
                "{} ids is not a multiple of k = {k}: is --top-k right? (DeepSeek-V2-Lite: 6)",
                id_f.len()
            )));
        }
        let row_start = rows.len();
        for (i, (a, b)) in id_f.iter().zip(prob_f).enumerate() {
            let id: u16 = a.trim().parse().map_err(|_| {
                err(format!("field {}: expert id {a:?} is not an integer: the file is damaged; fetch it again", i + 1))
            })?;
            // The row of this field: token i / k of the sequence, slot i % k.
            let (token, slot) = (i / k, i % k);
            if u32::from(id) >= num_experts {
                return Err(err(format!(
                    "field {}: token {token} of the sequence, slot {slot}: expert id {id} >= num_experts {num_experts}: \
                     is --num-experts right? (DeepSeek-V2-Lite: 64)",
                    i + 1
                )));
            }
            let row = &rows[row_start + token * k..];
            if let Some(first) = row.iter().position(|&(prev, _)| prev == id) {
                return Err(err(format!(
                    "field {}: token {token} of the sequence, slot {slot}: expert id {id} repeated in the row (also field {})",
                    i + 1,
                    token * k + first + 1
                )));
            }
            let p: f32 = b.trim().parse().map_err(|_| {
                err(format!(
                    "field {}: probability {b:?} is not a number: the file is damaged; fetch it again",
                    sep + 2 + i
                ))
            })?;
            if !(p.is_finite() && (0.0..=1.0).contains(&p)) {
                return Err(err(format!(
                    "field {}: probability {p} is not in [0, 1]: the file is damaged; fetch it again",
                    sep + 2 + i
                )));
            }
            rows.push((id, p));
        }
        seq_lens.push(id_f.len() / k);
        seq_lines.push(n + 1);
    }
    Ok(LayerFile { rows, seq_lens, seq_lines })
}

fn import_err(path: &Path, line: Option<usize>, message: String) -> TraceError {
    super::import_err("esft", path, line, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_domain(root: &Path, domain: &str, layers: &[(u32, &str)]) {
        let d = root.join(domain);
        std::fs::create_dir_all(&d).unwrap();
        for (l, text) in layers {
            std::fs::write(d.join(format!("expert_weights_{l}.txt")), text).unwrap();
        }
    }

    fn opts(domains: &[&str]) -> EsftOptions {
        EsftOptions {
            domains: domains.iter().map(|s| s.to_string()).collect(),
            num_experts: 8,
            top_k: 2,
            ..Default::default()
        }
    }

    #[test]
    fn sorts_rows_floors_zeros_and_keeps_offsets() {
        let dir = tempfile::tempdir().unwrap();
        // Two sequences (2 tokens, 1 token) in layer 1 and layer 2; k = 2.
        write_domain(
            dir.path(),
            "a",
            &[
                (1, "3\t1\t5\t2\t\t0.1\t0.3\t0.2\t0.2\n7\t0\t\t0.0\t0.5\n"),
                (2, "0\t1\t2\t3\t\t0.4\t0.1\t0.1\t0.1\n4\t6\t\t0.25\t0.25\n"),
            ],
        );
        // (a trailing tab and a CRLF line end, as editors and spreadsheets leave them, read alike)
        write_domain(dir.path(), "b", &[(1, "1\t2\t\t0.3\t0.2\n"), (2, "5\t4\t\t0.2\t0.3\t\r\n")]);
        let t = import_esft(dir.path(), &opts(&["a", "b"])).unwrap();
        let v = t.view();
        assert_eq!(v.shape().tokens, 4);
        assert_eq!(v.shape().layers, 2);
        assert_eq!(v.meta().layer_ids, vec![1, 2]);
        // layer 1: token 0 [3:0.1, 1:0.3] -> [1, 3]; token 1 [5:0.2, 2:0.2] tie -> [2, 5];
        // token 2 [7:0.0, 0:0.5] -> [0, 7]; token 3 (domain b) [1:0.3, 2:0.2] -> [1, 2].
        assert_eq!(v.layer_ids(0), &[1, 3, 2, 5, 0, 7, 1, 2]);
        // layer 2: [0, 1]; [2, 3] (tie 0.1); [4, 6] (tie); [4, 5].
        assert_eq!(v.layer_ids(1), &[0, 1, 2, 3, 4, 6, 4, 5]);
        assert_eq!(v.seq_offsets().unwrap(), &[0, 2, 3]);
        let g = v.layer_gates(0).unwrap();
        assert_eq!(g[5], 0.0);
        let s = v.layer_scores(0).unwrap();
        assert_eq!(s[5], PROB_FLOOR.ln());
        assert_eq!(s[0], 0.3f32.ln());
        assert_eq!(v.meta().extra["floored_probs"], "1");
        assert_eq!(v.meta().extra["domain_tokens"], "a:3,b:1");
    }

    #[test]
    fn refuses_mismatched_sequences_and_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        write_domain(dir.path(), "a", &[(1, "1\t2\t\t0.3\t0.2\n"), (2, "1\t2\t3\t4\t\t0.3\t0.2\t0.1\t0.1\n")]);
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err().to_string();
        assert!(e.contains("expert_weights_2.txt:1: sequence lengths differ"), "{e}");
        assert!(e.contains("sequence 0 has 2 tokens, 1 at line 1 of") && e.contains("expert_weights_1.txt"), "{e}");
        // A file with one sequence more names the counts, at the extra line.
        let dir = tempfile::tempdir().unwrap();
        write_domain(dir.path(), "a", &[(1, "1\t2\t\t0.3\t0.2\n"), (2, "1\t2\t\t0.3\t0.2\n\n3\t4\t\t0.3\t0.2\n")]);
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err().to_string();
        assert!(
            e.contains("expert_weights_2.txt:3: sequence lengths differ") && e.contains(": 2 sequences, 1 in"),
            "{e}"
        );

        let dir = tempfile::tempdir().unwrap();
        write_domain(dir.path(), "a", &[(1, "1\t2\t0.3\t0.2\n")]);
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err().to_string();
        assert!(e.contains("expert_weights_1.txt:1") && e.contains("no empty field"), "{e}");

        // Two files of one layer (`_1` and `_01`) are named both; an empty domain name is named.
        let dir = tempfile::tempdir().unwrap();
        write_domain(dir.path(), "a", &[(1, "1\t2\t\t0.3\t0.2\n")]);
        std::fs::write(dir.path().join("a/expert_weights_01.txt"), "1\t2\t\t0.3\t0.2\n").unwrap();
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err().to_string();
        assert!(
            e.contains("is also layer 1") && e.contains("expert_weights_1.txt") && e.contains("expert_weights_01.txt"),
            "{e}"
        );
        let e = import_esft(dir.path(), &opts(&["", "a"])).unwrap_err();
        assert!(matches!(e, TraceError::Config { key: "domains", .. }), "{e}");

        // Bad ids name the layer file and the line, not the directory: line 2, token 1, slot 0
        // (field 3) is out of range; in the other file, line 2's token 0 repeats id 4.
        let dir = tempfile::tempdir().unwrap();
        let good = "1\t2\t\t0.3\t0.2\n";
        write_domain(
            dir.path(),
            "a",
            &[(1, &format!("{good}1\t2\t9\t3\t\t0.3\t0.2\t0.3\t0.2\n")), (2, &format!("{good}4\t4\t\t0.3\t0.2\n"))],
        );
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err();
        match &e {
            TraceError::Import { format: "esft", location, message } => {
                assert!(location.ends_with(&format!("a{}expert_weights_1.txt:2", std::path::MAIN_SEPARATOR)), "{e}");
                assert!(
                    message.starts_with("field 3: token 1 of the sequence, slot 0: expert id 9 >= num_experts 8: is --num-experts right?"),
                    "{message}"
                );
            }
            other => panic!("expected an import error, got {other}"),
        }
        std::fs::write(dir.path().join("a/expert_weights_1.txt"), good.repeat(2)).unwrap();
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err();
        match &e {
            TraceError::Import { location, message, .. } => {
                assert!(location.ends_with("expert_weights_2.txt:2"), "{e}");
                assert_eq!(
                    message,
                    "field 2: token 0 of the sequence, slot 1: expert id 4 repeated in the row (also field 1)"
                );
            }
            other => panic!("expected an import error, got {other}"),
        }

        // A layer file missing between the lowest and highest (layer 3 of 1..5; the ids need not
        // start at 0): refused, naming the domain directory and the missing file.
        let dir = tempfile::tempdir().unwrap();
        write_domain(dir.path(), "a", &[(1, good), (2, good), (4, good), (5, good)]);
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err();
        match &e {
            TraceError::Import { format: "esft", location, message } => {
                assert_eq!(location, &dir.path().join("a").display().to_string());
                assert!(
                    message.starts_with("no layer file for layer 3 (expert_weights_3.txt), between layers 1 and 5"),
                    "{e}"
                );
            }
            other => panic!("expected an import error, got {other}"),
        }
        std::fs::remove_file(dir.path().join("a/expert_weights_5.txt")).unwrap();
        std::fs::remove_file(dir.path().join("a/expert_weights_2.txt")).unwrap();
        let e = import_esft(dir.path(), &opts(&["a"])).unwrap_err().to_string();
        assert!(e.contains("no layer file for layers 2, 3 (expert_weights_2.txt), between layers 1 and 4"), "{e}");

        let e = import_esft(dir.path(), &opts(&["missing"])).unwrap_err().to_string();
        assert!(e.contains(r#"no domain "missing""#) && e.contains("it has: a"), "{e}");
        // A missing data directory is named as missing, with how to get the data.
        let gone = dir.path().join("not-fetched");
        let e = import_esft(&gone, &opts(&["a"])).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} is missing", gone.display())) && e.contains("cargo xtask fetch-real-data"),
            "{e}"
        );
        // A file where the directory is expected is named as a file, not as missing; so is a
        // domain that is a file; a directory without domains says so.
        let file = dir.path().join("a/expert_weights_1.txt");
        let e = import_esft(&file, &opts(&["a"])).unwrap_err().to_string();
        assert!(e.contains(&format!("{} is a file, not a directory", file.display())), "{e}");
        assert!(!e.contains("missing") && !e.contains("no domain"), "{e}");
        std::fs::write(dir.path().join("b"), "").unwrap();
        let e = import_esft(dir.path(), &opts(&["b"])).unwrap_err().to_string();
        assert!(e.contains(&format!("{} is a file, not a directory", dir.path().join("b").display())), "{e}");
        let e = import_esft(dir.path().join("a"), &opts(&["a"])).unwrap_err().to_string();
        assert!(e.contains("it has: no domain directory at all"), "{e}");
    }
}
