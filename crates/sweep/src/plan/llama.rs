//! llama.cpp flags from a plan, as llama.cpp's argument parser reads them (`common/arg.cpp`).
//!
//! - `-ot PATTERN=BUFFER[,PATTERN=BUFFER...]` (`--override-tensor`): the value is split on `,`,
//!   each part at its first `=`; a tensor goes to the buffer of the first override whose regex
//!   (`std::regex_search`, ECMAScript) matches its name, overrides in command-line order.
//! - `--cpu-moe`: one override, [`EXPS_REGEX`] to the CPU.
//! - `--n-cpu-moe N`: N overrides `blk\.i` + [`EXPS_REGEX`] to the CPU, for blocks i = 0..N−1,
//!   whatever those blocks hold: a block without routed experts matches nothing, an MoE block the
//!   trace did not record is moved all the same.
//!
//! The flags are [`LlamaFlags::args`], one argument each, never shell-quoted: written one per line
//! ([`LlamaFlags::lines`]) they are read back whole by `mapfile -t`, `xargs -d '\n'` or
//! `$(cat FILE)` (no argument holds a blank or a glob character). `--moe-hot-count` (per-layer hot
//! experts) is not a llama.cpp flag: the pull requests that proposed it were closed unmerged, so it
//! is never among the flags ([`super::hot_count_list`] spells its list for those who run such a
//! patch).
//!
//! Every flag places whole blocks, so the flags must account for every block of the model that
//! has routed experts: [`moe_blocks`] refuses a trace that lacks some of them (the plan neither
//! places nor prices their experts), and `--n-cpu-moe N` is offered only when it places exactly
//! what the `-ot` form places.

use std::fmt::Write as _;

/// llama.cpp's `LLM_FFN_EXPS_REGEX` (`common/common.h`): the routed-expert tensors of a block
/// (`ffn_{up,down,gate}_exps`, the fused `ffn_gate_up_exps`, `ffn_*_chexps`); never a shared
/// expert's `ffn_*_shexp` nor the router `ffn_gate_inp`.
pub const EXPS_REGEX: &str = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps";

/// Why llama.cpp flags cannot say a plan exactly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagsError {
    /// MoE blocks of the model (`moe_layers`) that the trace has no routing for.
    #[error(
        "blocks {} have routed experts (moe_layers) but the trace has no routing for them: the plan neither \
         places nor prices their experts, so it writes no llama.cpp flags; trace every MoE layer",
        ranges(blocks)
    )]
    Untraced {
        /// The untraced MoE blocks.
        blocks: Vec<u32>,
    },
    /// Blocks below the last traced layer that the trace lacks, with no `moe_layers` to say
    /// whether they have routed experts.
    #[error(
        "the trace lacks blocks {} below its last layer {last}: llama.cpp flags place every MoE block, so \
         say which blocks have routed experts (moe_layers {}, if those blocks are dense) or trace them",
        ranges(blocks),
        ranges(traced)
    )]
    Unknown {
        /// The blocks the trace lacks.
        blocks: Vec<u32>,
        /// The last traced layer.
        last: u32,
        /// The traced layers.
        traced: Vec<u32>,
    },
    /// `moe_layers` leaves out layers the trace has routing for.
    #[error(
        "moe_layers {} leaves out traced layers {}: a traced layer has routed experts",
        ranges(given),
        ranges(missing)
    )]
    NotMoe {
        /// The blocks given.
        given: Vec<u32>,
        /// The traced layers not among them.
        missing: Vec<u32>,
    },
    /// A buffer type that llama.cpp's `-ot` cannot carry.
    #[error("buffer type {0:?}: a llama.cpp buffer name (CUDA0, CPU, ...) holds no `,`, `=`, blank or quote")]
    Device(String),
    /// A plan whose per-layer lists do not match its layers.
    #[error("{what}: {got} entries for {layers} layers")]
    Shape {
        /// The list.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The layers.
        layers: usize,
    },
}

/// `1-3,5,7-8`: ids ascending, runs joined; the form [`parse_blocks`] reads.
pub fn ranges(ids: &[u32]) -> String {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut s = String::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        if !s.is_empty() {
            s.push(',');
        }
        let _ = if j > i { write!(s, "{}-{}", v[i], v[j]) } else { write!(s, "{}", v[i]) };
        i = j + 1;
    }
    s
}

/// Reads a list of blocks, `1-26` or `0,8,12-18`, ascending and without repeats.
///
/// # Errors
/// A part that is not a block id or an ascending range `A-B`.
pub fn parse_blocks(s: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let num = |x: &str| x.trim().parse::<u32>().map_err(|_| format!("{part:?} is not a block id or a range A-B"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("{part:?}: a range A-B needs A <= B"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The model's blocks with routed experts that llama.cpp flags must place: `moe_layers` when
/// given (it must hold every traced layer, and the trace every one of its blocks), else the traced
/// layers, provided the trace lacks no block below its last layer (such a block may be dense or
/// an MoE layer the trace did not record; only `moe_layers` can tell). Blocks above the last traced
/// layer are taken to have no routed experts unless `moe_layers` names them.
///
/// # Errors
/// [`FlagsError::NotMoe`], [`FlagsError::Untraced`], [`FlagsError::Unknown`].
pub fn moe_blocks(traced: &[u32], moe_layers: Option<&[u32]>) -> Result<Vec<u32>, FlagsError> {
    let mut t = traced.to_vec();
    t.sort_unstable();
    t.dedup();
    match moe_layers {
        Some(given) => {
            let missing: Vec<u32> = t.iter().copied().filter(|id| !given.contains(id)).collect();
            if !missing.is_empty() {
                return Err(FlagsError::NotMoe { given: given.to_vec(), missing });
            }
            let blocks: Vec<u32> = given.iter().copied().filter(|id| !t.contains(id)).collect();
            if !blocks.is_empty() {
                return Err(FlagsError::Untraced { blocks });
            }
        }
        None => {
            let Some(&last) = t.last() else { return Ok(t) };
            let blocks: Vec<u32> = (0..last).filter(|id| !t.contains(id)).collect();
            if !blocks.is_empty() {
                return Err(FlagsError::Unknown { blocks, last, traced: t });
            }
        }
    }
    Ok(t)
}

/// The `-ot` pattern of the routed-expert tensors of `blocks`: `blk\.(1|2|3)` + [`EXPS_REGEX`]
/// (the `\.` after the id keeps block 1 from matching block 12).
pub fn blocks_pattern(blocks: &[u32]) -> String {
    let ids: Vec<String> = blocks.iter().map(u32::to_string).collect();
    format!(r"blk\.({}){EXPS_REGEX}", ids.join("|"))
}

/// llama.cpp flags that place a plan's experts, block by block.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LlamaFlags {
    /// The arguments in order, one each, unquoted (`-ot`, then its value, ...).
    pub args: Vec<String>,
    /// N such that `--n-cpu-moe N` places exactly what `args` place, when one does.
    pub n_cpu_moe: Option<u32>,
    /// The model's blocks with routed experts the flags account for ([`moe_blocks`]).
    pub moe_blocks: Vec<u32>,
    /// Those of them whose experts the flags put on the CPU.
    pub cpu_blocks: Vec<u32>,
}

impl LlamaFlags {
    /// One argument per line, each line ending in `\n` (nothing for no arguments).
    pub fn lines(&self) -> String {
        self.args.iter().map(|a| format!("{a}\n")).collect()
    }

    /// The arguments as one line for a POSIX shell (an argument holding a character the shell
    /// reads is single-quoted), for people to read and paste; files hold [`Self::lines`].
    pub fn shell_line(&self) -> String {
        let quote = |a: &String| {
            if a.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,=/:+@%".contains(c)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        };
        self.args.iter().map(quote).collect::<Vec<_>>().join(" ")
    }
}

/// The flags of a plan that puts whole layers on the CPU (`plan --exec host`'s per-layer plan):
/// `-ot PATTERN=CPU` for `cpu` (model ids, among `traced`), every other MoE block left where
/// llama.cpp puts it (the GPU with `-ngl` at least the block count); `--n-cpu-moe N` when the
/// CPU blocks are exactly the MoE blocks below N.
///
/// # Errors
/// [`moe_blocks`]'s.
pub fn cpu_layer_flags(traced: &[u32], cpu: &[u32], moe_layers: Option<&[u32]>) -> Result<LlamaFlags, FlagsError> {
    let moe = moe_blocks(traced, moe_layers)?;
    let mut cpu = cpu.to_vec();
    cpu.sort_unstable();
    cpu.dedup();
    let Some(&last) = cpu.last() else {
        return Ok(LlamaFlags { args: Vec::new(), n_cpu_moe: None, moe_blocks: moe, cpu_blocks: cpu });
    };
    let n = last + 1;
    let exact = moe.iter().filter(|&&b| b < n).all(|b| cpu.contains(b));
    let args = vec!["-ot".to_string(), format!("{}=CPU", blocks_pattern(&cpu))];
    Ok(LlamaFlags { args, n_cpu_moe: exact.then_some(n), moe_blocks: moe, cpu_blocks: cpu })
}

/// The flags of a plan that keeps whole layers (`whole`, model ids) in fast memory `device` and
/// every other expert on the CPU (stock llama.cpp has no per-expert placement):
/// `-ot PATTERN=DEVICE` for `whole`, then `--cpu-moe`, in this order (the first matching override
/// wins, so an earlier `--cpu-moe` would take the whole layers too).
///
/// # Errors
/// [`FlagsError::Device`] for a buffer name `-ot` cannot carry; [`moe_blocks`]'s.
pub fn whole_layer_flags(
    traced: &[u32],
    whole: &[u32],
    device: &str,
    moe_layers: Option<&[u32]>,
) -> Result<LlamaFlags, FlagsError> {
    if device.is_empty() || device.chars().any(|c| ",=\"'`\\$".contains(c) || c.is_whitespace() || c.is_control()) {
        return Err(FlagsError::Device(device.to_string()));
    }
    let moe = moe_blocks(traced, moe_layers)?;
    let mut whole = whole.to_vec();
    whole.sort_unstable();
    whole.dedup();
    let cpu: Vec<u32> = moe.iter().copied().filter(|b| !whole.contains(b)).collect();
    let mut args = Vec::new();
    if !whole.is_empty() {
        args.extend(["-ot".to_string(), format!("{}={device}", blocks_pattern(&whole))]);
    }
    args.push("--cpu-moe".into());
    Ok(LlamaFlags { args, n_cpu_moe: None, moe_blocks: moe, cpu_blocks: cpu })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (traced, cpu, moe_layers) → (CPU blocks, n_cpu_moe) or the error's start.
    fn check(traced: &[u32], cpu: &[u32], moe_layers: Option<&[u32]>, expect: Result<(&[u32], Option<u32>), &str>) {
        let got = cpu_layer_flags(traced, cpu, moe_layers);
        match (got, expect) {
            (Ok(f), Ok((want_cpu, want_n))) => {
                assert_eq!((f.cpu_blocks.as_slice(), f.n_cpu_moe), (want_cpu, want_n), "{traced:?} {cpu:?}");
                assert_eq!(f.args.is_empty(), want_cpu.is_empty());
            }
            (Err(e), Err(want)) => assert!(e.to_string().starts_with(want), "{e}"),
            (got, want) => panic!("{traced:?} {cpu:?} {moe_layers:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn n_cpu_moe_only_when_exact_and_untraced_blocks_refused() {
        let esft: Vec<u32> = (1..=26).collect();
        let first22: Vec<u32> = (1..=22).collect();
        let qwen = [0, 8, 12, 18, 23];
        // DeepSeek-V2-Lite: block 0 dense (moe_layers 1-26): --n-cpu-moe 23 covers blocks 0..22.
        check(&esft, &first22, Some(&esft), Ok((&first22, Some(23))));
        // Without moe_layers, block 0 may be an MoE layer the trace lacks: refused, named.
        check(&esft, &first22, None, Err("the trace lacks blocks 0 below its last layer 26"));
        // CPU layers not the first ones: -ot only.
        check(&esft, &[2, 5], Some(&esft), Ok((&[2, 5], None)));
        check(&esft, &[1, 2], Some(&esft), Ok((&[1, 2], Some(3))));
        // Qwen1.5-MoE: 24 MoE blocks, five traced: refused, naming the 19 untraced ones.
        let all24: Vec<u32> = (0..24).collect();
        check(&qwen, &[0, 8, 12, 18], Some(&all24), Err("blocks 1-7,9-11,13-17,19-22 have routed experts"));
        check(&qwen, &[0, 8, 12, 18], None, Err("the trace lacks blocks 1-7,9-11,13-17,19-22"));
        // Said dense: the -ot form, and --n-cpu-moe 19 is exact then.
        check(&qwen, &[0, 8, 12, 18], Some(&qwen), Ok((&[0, 8, 12, 18], Some(19))));
        check(&qwen, &[8], Some(&qwen), Ok((&[8], None)));
        // moe_layers that leave out a traced layer.
        check(&qwen, &[], Some(&[0, 8]), Err("moe_layers 0,8 leaves out traced layers 12,18,23"));
        // Nothing on the CPU: no flags.
        check(&[0, 1, 2], &[], None, Ok((&[], None)));
        check(&[0, 1, 2], &[0, 1, 2], None, Ok((&[0, 1, 2], Some(3))));
    }

    #[test]
    fn blocks_parse_and_print_as_ranges() {
        for (s, want) in
            [("1-3,5", Ok(vec![1, 2, 3, 5])), ("0, 8 ,12-13", Ok(vec![0, 8, 12, 13])), ("3-1", Err(())), ("x", Err(()))]
        {
            assert_eq!(parse_blocks(s).map_err(|_| ()), want, "{s}");
        }
        assert_eq!(ranges(&[5, 1, 2, 3, 7, 8]), "1-3,5,7-8");
        assert_eq!(parse_blocks(&ranges(&[0, 8, 12, 18, 23])).unwrap(), [0, 8, 12, 18, 23]);
    }

    #[test]
    fn whole_layers_precede_cpu_moe_and_devices_are_checked() {
        let f = whole_layer_flags(&[0, 1, 2], &[1], "CUDA0", None).unwrap();
        assert_eq!(f.lines(), format!("-ot\nblk\\.(1){EXPS_REGEX}=CUDA0\n--cpu-moe\n"));
        assert_eq!(f.cpu_blocks, [0, 2]);
        assert_eq!(whole_layer_flags(&[0], &[], "CPU", None).unwrap().args, ["--cpu-moe"]);
        for bad in ["CUDA0\"", "", "A,B", "a=b", "CUDA 0"] {
            assert_eq!(whole_layer_flags(&[0], &[0], bad, None), Err(FlagsError::Device(bad.into())));
        }
        let f = cpu_layer_flags(&[0, 1], &[0], None).unwrap();
        assert_eq!(f.shell_line(), format!("-ot 'blk\\.(0){EXPS_REGEX}=CPU'"));
    }
}
