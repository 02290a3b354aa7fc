use std::io::Write;
use std::path::{Path, PathBuf};

use super::*;

/// A `.npy` file as numpy 1.x/2.x `np.save` writes it: magic, version 1.0, the header dict
/// padded with spaces to a multiple of 64 bytes and ended by a newline, then the C-order data.
pub(crate) fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let shape = match shape {
        [] => String::new(),
        [d] => format!("{d},"),
        s => s.iter().map(usize::to_string).collect::<Vec<_>>().join(", "),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({shape}), }}");
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// A 0-d unicode array holding `text`, as `np.array(json.dumps(meta))` saves it.
pub(crate) fn meta_npy(text: &str) -> Vec<u8> {
    let data: Vec<u8> = text.chars().flat_map(|c| (c as u32).to_le_bytes()).collect();
    npy(&format!("<U{}", text.chars().count()), &[], &data)
}

/// An `.npz` as `np.savez` (stored) or `np.savez_compressed` (deflated) writes it: one
/// `NAME.npy` entry per array, zip64 extra fields forced (numpy opens each entry with
/// `force_zip64=True`).
pub(crate) fn npz(path: &Path, arrays: &[(&str, Vec<u8>)], compressed: bool) {
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let method = if compressed { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method).large_file(true);
    for (name, bytes) in arrays {
        z.start_file(format!("{name}.npy"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

fn i16s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|&x| (x as i16).to_le_bytes()).collect()
}

const META: &str = r#"{"model": "tiny", "top_k": 2, "k": 2, "num_experts": 4, "n_moe_layers": 2, "source": "test"}"#;

/// [2 layers, 3 tokens, k 2] ltk ids.
const IDS: [i64; 12] = [0, 1, 2, 3, 1, 0, /* layer 1 */ 3, 2, 0, 1, 2, 3];

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn npz_with_meta_is_read_as_numpy_saved_it() {
    let dir = tempfile::tempdir().unwrap();
    for compressed in [false, true] {
        let p = dir.path().join("r.npz");
        npz(&p, &[("experts", npy("<i2", &[2, 3, 2], &i16s(&IDS))), ("meta", meta_npy(META))], compressed);
        let opts = NumpyOptions { chunk: Some(2), ..Default::default() };
        let out = import_numpy(&p, &opts).unwrap();
        let v = out.trace.view();
        let s = v.shape();
        assert_eq!((s.layers, s.tokens, s.top_k, s.candidates, s.num_experts), (2, 3, 2, 2, 4));
        assert_eq!(v.layer_ids(0), &[0, 1, 2, 3, 1, 0]);
        assert_eq!(v.layer_ids(1), &[3, 2, 0, 1, 2, 3]);
        assert_eq!(v.seq_offsets().unwrap(), &[0, 2]);
        assert_eq!(v.meta().score_kind, ScoreKind::None);
        assert_eq!(v.meta().model, "tiny");
        assert_eq!(v.meta().layer_ids, vec![0, 1]);
        assert_eq!(v.meta().extra["layout"], "ltk");
        let r = &out.report;
        assert_eq!((r.records_read, r.tokens, r.layers, r.sequences), (6, 3, 2, Some(2)));
        let notes = r.notes.join("\n");
        assert!(
            notes.contains("array `experts`: <i2 [2, 3, 2], layout ltk (axis 0 matches meta n_moe_layers = 2)"),
            "{notes}"
        );
        assert!(notes.contains("E = 4 (meta num_experts)") && notes.contains("2 sequences from --chunk 2"), "{notes}");
        assert!(notes.contains("padding: none"), "{notes}");
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }
}

#[test]
fn every_integer_dtype_and_both_byte_orders() {
    let dir = tempfile::tempdir().unwrap();
    type Enc = fn(i64) -> Vec<u8>;
    let cases: [(&str, Enc); 12] = [
        ("|i1", |x| (x as i8).to_le_bytes().to_vec()),
        ("|u1", |x| (x as u8).to_le_bytes().to_vec()),
        ("<i2", |x| (x as i16).to_le_bytes().to_vec()),
        (">i2", |x| (x as i16).to_be_bytes().to_vec()),
        ("<u2", |x| (x as u16).to_le_bytes().to_vec()),
        (">u2", |x| (x as u16).to_be_bytes().to_vec()),
        ("<i4", |x| (x as i32).to_le_bytes().to_vec()),
        (">i4", |x| (x as i32).to_be_bytes().to_vec()),
        ("<u4", |x| (x as u32).to_le_bytes().to_vec()),
        ("<i8", |x| x.to_le_bytes().to_vec()),
        (">i8", |x| x.to_be_bytes().to_vec()),
        (">u8", |x| (x as u64).to_be_bytes().to_vec()),
    ];
    for (descr, enc) in cases {
        let data: Vec<u8> = IDS.iter().flat_map(|&x| enc(x)).collect();
        let p = write(dir.path(), "r.npy", &npy(descr, &[2, 3, 2], &data));
        let opts = NumpyOptions { num_experts: Some(4), layout: Some(Layout::Ltk), ..Default::default() };
        let out = import_numpy(&p, &opts).unwrap_or_else(|e| panic!("{descr}: {e}"));
        assert_eq!(out.trace.view().layer_ids(1), &[3, 2, 0, 1, 2, 3], "{descr}");
    }
}

#[test]
fn tokens_major_arrays_are_transposed() {
    let dir = tempfile::tempdir().unwrap();
    // [3 tokens, 2 layers, 2]: token t, layer l holds IDS of (l, t).
    let tlk: Vec<i64> = (0..3).flat_map(|t| (0..2).flat_map(move |l| IDS[(l * 3 + t) * 2..][..2].to_vec())).collect();
    let data: Vec<u8> = tlk.iter().flat_map(|&x| (x as i32).to_be_bytes()).collect();
    let p = write(dir.path(), "r.npy", &npy(">i4", &[3, 2, 2], &data));
    let opts = NumpyOptions {
        num_experts: Some(4),
        layer_ids: Some(vec![3, 7]),
        phase: Some(Phase::Decode),
        ..Default::default()
    };
    // The layer ids give L = 2: axis 1.
    let out = import_numpy(&p, &opts).unwrap();
    let v = out.trace.view();
    assert_eq!(v.layer_ids(0), &[0, 1, 2, 3, 1, 0]);
    assert_eq!(v.layer_ids(1), &[3, 2, 0, 1, 2, 3]);
    assert_eq!((v.meta().layer_ids.clone(), v.meta().phase), (vec![3, 7], Phase::Decode));
    assert!(out.report.notes[0].contains("layout tlk (axis 1 matches --layers)"), "{:?}", out.report.notes);
    assert_eq!(v.seq_offsets(), None);
}

#[test]
fn padding_tokens_are_dropped_and_sequences_follow() {
    let dir = tempfile::tempdir().unwrap();
    // 4 tokens; token 1 and token 3 are padding in both layers (SGLang pads batches so).
    let ids = [0, 1, -1, -1, 2, 3, -1, -1, /* layer 1 */ 3, 2, -1, -1, 0, 1, -1, -1];
    let offsets: Vec<u8> = [0i64, 2, 4].iter().flat_map(|x| x.to_le_bytes()).collect();
    let p = dir.path().join("r.npz");
    npz(&p, &[("topk_ids", npy("<i2", &[2, 4, 2], &i16s(&ids))), ("seq_offsets", npy("<i8", &[3], &offsets))], false);
    let opts = NumpyOptions { num_experts: Some(4), layout: Some(Layout::Ltk), ..Default::default() };
    let out = import_numpy(&p, &opts).unwrap();
    let v = out.trace.view();
    assert_eq!(v.layer_ids(0), &[0, 1, 2, 3]);
    assert_eq!(v.seq_offsets().unwrap(), &[0, 1]);
    let r = &out.report;
    assert_eq!(r.dropped.len(), 1);
    assert_eq!((r.dropped[0].reason, r.dropped[0].tokens, r.dropped[0].records), (DropReason::Padding, 2, 4));
    assert!(r.notes.iter().any(|n| n == "padding: 4 rows of -1 (2 tokens padded in every layer, dropped)"));
    assert!(r.notes.iter().any(|n| n.starts_with("2 sequences from array `seq_offsets`")), "{:?}", r.notes);
}

#[test]
fn a_flat_copy_of_a_strided_topk_view_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    // E = 4, k = 2, 4 tokens: the memory of an argsort [tokens, E] read flat, 8 values per layer =
    // two whole permutations of 0..3.
    let perm = [2, 0, 3, 1, 1, 3, 0, 2];
    let ids: Vec<i64> = perm.iter().chain(&perm).copied().collect();
    let p = write(dir.path(), "r.npy", &npy("<i2", &[2, 4, 2], &i16s(&ids)));
    let opts = NumpyOptions { num_experts: Some(4), layout: Some(Layout::Ltk), ..Default::default() };
    let out = import_numpy(&p, &opts).unwrap();
    assert_eq!(out.report.warnings.len(), 1);
    assert!(out.report.warnings[0].starts_with("in 2 of 2 layers every one of the 4 experts is used exactly equally"));
}

/// Hostile inputs: each refused with a typed error naming the file and where, never a panic.
#[test]
fn hostile_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = npy("<i2", &[2, 3, 2], &i16s(&IDS));
    let opts = NumpyOptions { num_experts: Some(4), layout: Some(Layout::Ltk), ..Default::default() };
    let check = |bytes: &[u8], opts: &NumpyOptions, expect: &str| {
        let p = write(dir.path(), "bad.npy", bytes);
        let e = import_numpy(&p, opts).unwrap_err();
        assert!(matches!(e, TraceError::Import { format: "numpy", .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("bad.npy") && e.contains(expect), "want {expect:?} in {e}");
    };
    let with = |ids: &[i64]| npy("<i2", &[2, 3, 2], &i16s(ids));
    let mut one = IDS;
    check(&good[..good.len() - 3], &opts, "truncated: its shape needs 24 bytes of data, the file holds 21");
    check(&good[..40], &opts, "not a readable .npy header");
    check(b"", &opts, "the file is empty");
    check(b"hello", &opts, "neither a .npy file");
    check(&npy("<f4", &[2, 3, 2], &[0; 48]), &opts, "dtype <f4: expected integer expert ids");
    check(&with(&[-1; 12]), &opts, "every row is padding (-1): no tokens");
    one[9] = 4;
    check(
        &with(&one),
        &opts,
        "array `bad` [1, 1, 1] (layer index 1, token 1, slot 1; element 9, byte 146 of bad.npy): expert id 4 is >= num_experts 4",
    );
    one[9] = -2;
    check(&with(&one), &opts, "expert id -2 is negative (only -1, padding, may be)");
    one[9] = -1;
    check(
        &with(&one),
        &opts,
        "array `bad` [1, 1] (layer index 1, token 1; element 8, byte 144 of bad.npy): 1 ids and 1 padding slots (-1): a row with fewer than k = 2 ids",
    );
    one[9] = 0;
    check(&with(&one), &opts, "slot 1; element 9, byte 146 of bad.npy): expert id 0 repeated in the row");
    let mut pad = IDS;
    pad[2..4].copy_from_slice(&[-1, -1]);
    check(&with(&pad), &opts, "token 1 is padding (-1) in 1 of 2 layers");
    check(&npy("<i2", &[3, 2], &i16s(&IDS[..6])), &opts, "shape [3, 2]: expected 3 axes");
    check(&npy("<i2", &[2, 0, 2], &[]), &opts, "shape [2, 0, 2]: no tokens");
    check(&good.clone().into_iter().chain([0u8; 2]).collect::<Vec<_>>(), &opts, "bytes past the end");
    let mut fortran = good.clone();
    let at = fortran.windows(5).position(|w| w == b"False").unwrap();
    fortran[at..at + 5].copy_from_slice(b"True ");
    check(&fortran, &opts, "Fortran order");
    // Options the file cannot settle.
    check(&good, &NumpyOptions { num_experts: Some(4), ..Default::default() }, "the axis order is not known");
    check(&good, &NumpyOptions { layout: Some(Layout::Ltk), ..Default::default() }, "give --num-experts");
    let square = npy("<i2", &[2, 2, 2], &i16s(&IDS[..8]));
    let o = NumpyOptions { layer_ids: Some(vec![0, 1]), num_experts: Some(4), ..Default::default() };
    check(&square, &o, "both of the first two axes match --layers: give --layout ltk or tlk");
    let o = NumpyOptions { chunk: Some(0), ..opts.clone() };
    check(&good, &o, "--chunk 0");
    check(&good, &NumpyOptions { array: Some("x".into()), ..opts.clone() }, "a .npy file holds one array");
    let o = NumpyOptions { layout: Some(Layout::Tlk), layer_ids: Some(vec![0, 1]), ..opts.clone() };
    check(&good, &o, "read as tlk has 3 layers, but --layers gives 2");
}

#[test]
fn hostile_archives_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.npz");
    let opts = NumpyOptions::default();
    let ids = || npy("<i2", &[2, 3, 2], &i16s(&IDS));
    let check = |arrays: &[(&str, Vec<u8>)], opts: &NumpyOptions, expect: &str| {
        npz(&p, arrays, true);
        let e = import_numpy(&p, opts).unwrap_err();
        assert!(matches!(e, TraceError::Import { format: "numpy", .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("bad.npz") && e.contains(expect), "want {expect:?} in {e}");
    };
    check(&[], &opts, "no 3-D integer array");
    check(&[("scores", npy("<f4", &[2, 3, 2], &[0; 48]))], &opts, "the archive holds: scores <f4 [2, 3, 2]");
    check(&[("a", ids()), ("b", ids())], &opts, "several 3-D integer arrays (a, b)");
    check(
        &[("experts", ids())],
        &NumpyOptions { array: Some("ids".into()), ..opts.clone() },
        "no array `ids` (--array)",
    );
    check(&[("experts", ids()), ("meta", meta_npy("{\"model\": "))], &opts, "array `meta`: not JSON");
    check(&[("experts", ids()), ("meta", npy("|O", &[], &[0x80, 0x04]))], &opts, "a pickled Python object");
    let m = META.replace("\"k\": 2", "\"k\": 3");
    check(&[("experts", ids()), ("meta", meta_npy(&m))], &opts, "the meta's `k` = 3, but the array has 2 slots");
    let o = NumpyOptions { num_experts: Some(8), ..opts.clone() };
    check(&[("experts", ids()), ("meta", meta_npy(META))], &o, "--num-experts 8 but the meta's `num_experts` is 4");
    let off = |v: &[i64]| npy("<i8", &[v.len()], &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>());
    let meta = || ("meta", meta_npy(META));
    check(&[("experts", ids()), meta(), ("offsets", off(&[1]))], &opts, "the first sequence must start at token 0");
    check(&[("experts", ids()), meta(), ("offsets", off(&[0, 2, 2]))], &opts, "starts must increase");
    check(&[("experts", ids()), meta(), ("offsets", off(&[0, 5]))], &opts, "past the last token");
    let o = NumpyOptions { chunk: Some(2), ..opts.clone() };
    check(&[("experts", ids()), meta(), ("offsets", off(&[0]))], &o, "--chunk and the array `offsets` both give");
    // A truncated archive and a damaged entry (the CRC is checked at the end of the entry).
    npz(&p, &[("experts", ids()), meta()], false);
    let mut bytes = std::fs::read(&p).unwrap();
    let cut = write(dir.path(), "bad.npz", &bytes[..bytes.len() / 2]);
    let e = import_numpy(&cut, &opts).unwrap_err().to_string();
    assert!(e.contains("bad.npz") && e.contains("not a readable .npz (zip) archive"), "{e}");
    let at = bytes.windows(4).position(|w| w == [3, 0, 2, 0]).unwrap();
    bytes[at] = 1;
    let e = import_numpy(write(dir.path(), "bad.npz", &bytes), &opts).unwrap_err().to_string();
    assert!(e.contains("bad.npz") && e.contains("array `experts`") && e.to_lowercase().contains("checksum"), "{e}");
}
