//! `export llama-cpp`: its file read back as llama.cpp reads its command line (`common/arg.cpp`),
//! each override matched against the GGUF tensor names of two architectures (qwen2moe: every
//! block MoE with a shared expert; deepseek2: a dense first block, then MoE blocks with shared
//! experts). One row per plan: the blocks whose routed experts land on each buffer, or the
//! refusal. A shared expert (`ffn_*_shexp`), the router and the dense tensors are never moved.

mod common;

use common::{run, s};
use regex::Regex;

/// An architecture's tensor names: `(name, Some(block))` for a routed-expert tensor.
fn tensors(arch: Arch) -> Vec<(String, Option<u32>)> {
    let mut t: Vec<(String, Option<u32>)> =
        ["token_embd.weight", "output_norm.weight", "output.weight"].iter().map(|n| (n.to_string(), None)).collect();
    let (blocks, dense) = match arch {
        Arch::Qwen2Moe => (24, 0),
        Arch::Deepseek2 => (27, 1),
    };
    for b in 0..blocks {
        for n in ["attn_norm.weight", "attn_q.weight", "attn_output.weight", "ffn_norm.weight"] {
            t.push((format!("blk.{b}.{n}"), None));
        }
        if b < dense {
            for n in ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"] {
                t.push((format!("blk.{b}.{n}"), None));
            }
            continue;
        }
        for n in ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"] {
            t.push((format!("blk.{b}.{n}"), Some(b)));
        }
        let shared = ["ffn_gate_inp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"];
        for n in shared.iter().chain(if arch == Arch::Qwen2Moe { &["ffn_gate_inp_shexp.weight"][..] } else { &[] }) {
            t.push((format!("blk.{b}.{n}"), None));
        }
    }
    t
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Qwen2Moe,
    Deepseek2,
}

/// llama.cpp's `LLM_FFN_EXPS_REGEX`, which `--cpu-moe` and `--n-cpu-moe` use (`common/common.h`).
const EXPS: &str = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps";

/// The tensor overrides of `argv` in order, as `common/arg.cpp` builds them: `-ot` /
/// `--override-tensor` splits its value on `,`, each part at its first `=` into a pattern and a
/// buffer name; `--cpu-moe` adds `EXPS` → CPU; `--n-cpu-moe N` adds `blk\.i` + `EXPS` → CPU for
/// i < N. Any other argument is refused, as llama.cpp refuses an argument it does not know.
fn overrides(argv: &[&str]) -> Result<Vec<(Regex, String)>, String> {
    let mut out = Vec::new();
    let mut it = argv.iter();
    let exps = Regex::new(EXPS).unwrap();
    while let Some(&a) = it.next() {
        match a {
            "-ot" | "--override-tensor" => {
                let v = it.next().ok_or("-ot: expected value")?;
                for part in v.split(',') {
                    let (pat, buf) = part.split_once('=').ok_or("invalid value")?;
                    if !["CPU", "CUDA0"].contains(&buf) {
                        return Err(format!("unknown buffer type {buf:?}"));
                    }
                    out.push((Regex::new(pat).map_err(|e| e.to_string())?, buf.to_string()));
                }
            }
            "-cmoe" | "--cpu-moe" => out.push((exps.clone(), "CPU".into())),
            "-ncmoe" | "--n-cpu-moe" => {
                let n: u32 = it.next().ok_or("--n-cpu-moe: expected value")?.parse().map_err(|_| "invalid value")?;
                out.extend((0..n).map(|i| (Regex::new(&format!(r"blk\.{i}{EXPS}")).unwrap(), "CPU".to_string())));
            }
            other => return Err(format!("invalid argument: {other}")),
        }
    }
    Ok(out)
}

/// Where each tensor of `arch` goes: the buffer of the first override whose regex is found in
/// its name (`std::regex_search`), else `-` (llama.cpp's own placement).
fn placement(ov: &[(Regex, String)], arch: Arch) -> Vec<(String, Option<u32>, String)> {
    tensors(arch)
        .into_iter()
        .map(|(name, block)| {
            let buf = ov.iter().find(|(re, _)| re.is_match(&name)).map_or("-".to_string(), |(_, b)| b.clone());
            (name, block, buf)
        })
        .collect()
}

/// A hybrid plan's per-layer part: `cpu` of `layer_ids` on the CPU, the rest on the GPU.
fn hybrid_plan(layer_ids: &[u32], cpu: &[u32]) -> serde_json::Value {
    let counts: Vec<u32> = layer_ids.iter().map(|id| if cpu.contains(id) { 0 } else { 64 }).collect();
    serde_json::json!({"kind": "moe-offload-hybrid-plan", "layer_ids": layer_ids,
        "per_layer": {"granularity": "layer", "counts": counts}})
}

/// A cache plan of E = 8 keeping every expert, caps 8 in `whole` and 2 elsewhere.
fn cache_plan(layer_ids: &[u32], whole: &[u32]) -> serde_json::Value {
    let caps: Vec<u32> = layer_ids.iter().map(|id| if whole.contains(id) { 8 } else { 2 }).collect();
    let layers: Vec<Vec<u32>> = layer_ids.iter().map(|_| (0..8).collect()).collect();
    serde_json::json!({"chosen": {"variant": "full", "plan": {"caps": caps},
        "keep_map": {"metric": "full", "k": 8, "num_experts": 8, "layer_ids": layer_ids, "layers": layers,
                     "stats_sha256": "", "short_layers": []}}})
}

/// What a row expects: the routed-expert blocks on each buffer and the `--n-cpu-moe` announced
/// as the same, or the start of llama.cpp's or moe-offload's refusal.
#[derive(Debug)]
enum Expect<'a> {
    Placed { cpu: Vec<u32>, gpu: Vec<u32>, n_cpu_moe: Option<u32> },
    Refused(&'a str),
}

fn check(arch: Arch, plan: serde_json::Value, extra: &[&str], expect: Expect<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    std::fs::write(&path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let out = run(&[&["export", "llama-cpp", s(&path), "-o", "-"][..], extra].concat());
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    let argv: Vec<&str> = stdout.lines().collect();
    // One argument per line, each safe as a word of `$(cat FILE)`: no blank, quote or glob.
    for a in &argv {
        assert!(!a.is_empty() && !a.contains(char::is_whitespace), "{a:?}");
        assert!(!a.contains(['"', '\'', '*', '?', '[', '$', '`']), "{a:?}");
    }
    let parsed = if out.status.success() { overrides(&argv) } else { Err(stderr.clone()) };
    match (parsed, expect) {
        (Ok(ov), Expect::Placed { cpu, gpu, n_cpu_moe }) => {
            let placed = placement(&ov, arch);
            for (name, block, buf) in &placed {
                let want = match block {
                    Some(b) if cpu.contains(b) => "CPU",
                    Some(b) if gpu.contains(b) => "CUDA0",
                    _ => "-",
                };
                assert_eq!(buf, want, "{arch:?} {name}: {stdout}");
            }
            // The `--n-cpu-moe N` the status line offers places every tensor the same.
            let said = stderr
                .split("the same as --n-cpu-moe ")
                .nth(1)
                .map(|t| t.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse::<u32>().unwrap());
            assert_eq!(said, n_cpu_moe, "{stderr}");
            if let Some(n) = said {
                let alt = placement(&overrides(&["--n-cpu-moe", &n.to_string()]).unwrap(), arch);
                assert_eq!(alt, placed, "--n-cpu-moe {n} against {stdout}");
            }
        }
        (Err(e), Expect::Refused(want)) => assert!(e.contains(want), "want {want:?}, got {e}"),
        (got, want) => panic!("{arch:?} {extra:?}: got {got:?} ({stdout}{stderr}), want {want:?}"),
    }
}

#[test]
fn llama_cpp_reads_the_flags_as_planned() {
    use Arch::{Deepseek2, Qwen2Moe};
    use Expect::{Placed, Refused};
    let dsv2: Vec<u32> = (1..=26).collect();
    let qwen_all: Vec<u32> = (0..24).collect();
    let qwen5 = [0, 8, 12, 18, 23];
    let upto = |a: u32, b: u32| -> Vec<u32> { (a..=b).collect() };
    // A hybrid plan is a plan; DeepSeek-V2-Lite's dense block 0 said so: --n-cpu-moe 23 is exact.
    check(
        Deepseek2,
        hybrid_plan(&dsv2, &upto(1, 22)),
        &["--moe-layers", "1-26"],
        Placed { cpu: upto(1, 22), gpu: vec![], n_cpu_moe: Some(23) },
    );
    // Block 0 unsaid: it may be an MoE layer the trace lacks, so no flags, the block named.
    check(
        Deepseek2,
        hybrid_plan(&dsv2, &upto(1, 22)),
        &[],
        Refused("the trace lacks blocks 0 below its last layer 26"),
    );
    // Qwen1.5-MoE's vLLM trace of five layers: refused, never `-ot` for four and `--n-cpu-moe 19`.
    check(Qwen2Moe, hybrid_plan(&qwen5, &[0, 8, 12, 18]), &[], Refused("the trace lacks blocks 1-7,9-11,13-17,19-22"));
    check(
        Qwen2Moe,
        hybrid_plan(&qwen5, &[0, 8, 12, 18]),
        &["--moe-layers", "0-23"],
        Refused("blocks 1-7,9-11,13-17,19-22 have routed experts (--moe-layers) but the trace has no routing"),
    );
    // CPU layers that are not the first ones: `-ot` alone, no --n-cpu-moe.
    check(
        Qwen2Moe,
        hybrid_plan(&qwen_all, &[2, 5, 12]),
        &[],
        Placed { cpu: vec![2, 5, 12], gpu: vec![], n_cpu_moe: None },
    );
    check(
        Qwen2Moe,
        hybrid_plan(&qwen_all, &upto(0, 9)),
        &[],
        Placed { cpu: upto(0, 9), gpu: vec![], n_cpu_moe: Some(10) },
    );
    // A cache plan: its whole layers in CUDA0, every other expert on the CPU, in an order that
    // llama.cpp honours (no `--moe-hot-count`, no quotes inside an argument).
    let rest = |whole: &[u32], all: &[u32]| all.iter().copied().filter(|b| !whole.contains(b)).collect::<Vec<_>>();
    check(
        Qwen2Moe,
        cache_plan(&qwen_all, &[1, 3]),
        &[],
        Placed { cpu: rest(&[1, 3], &qwen_all), gpu: vec![1, 3], n_cpu_moe: None },
    );
    check(
        Deepseek2,
        cache_plan(&dsv2, &[11]),
        &["--moe-layers", "1-26"],
        Placed { cpu: rest(&[11], &dsv2), gpu: vec![11], n_cpu_moe: None },
    );
    // A buffer name with a quote is refused, not written for llama.cpp to refuse.
    check(Qwen2Moe, cache_plan(&qwen_all, &[1]), &["--device", "CUDA0\""], Refused("buffer type \"CUDA0\\\"\""));
    // The hot counts of unmerged patches only on request, and stock llama.cpp refuses them.
    check(
        Qwen2Moe,
        cache_plan(&qwen_all, &[1]),
        &["--unmerged-hot-count"],
        Refused("invalid argument: --moe-hot-count"),
    );
}
