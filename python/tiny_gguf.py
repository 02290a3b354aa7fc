#!/usr/bin/env python3
"""Random-weight MoE models for testing a llama.cpp capture: a Hugging Face checkpoint and the
same weights as a GGUF file that llama.cpp runs.

    python python/tiny_gguf.py --arch qwen3_moe --out-dir /tmp/tiny      # tiny.gguf + hf/
    python python/tiny_gguf.py --arch mixtral --experts 16 --top-k 4 --hidden 256 --layers 8 \\
        --type f16 --out-dir /tmp/bigger

The model is made by transformers from a config (nothing is downloaded), its routers redrawn from
N(0, 1) so that routing is decisive, saved with `save_pretrained`, and written as GGUF with the
`gguf` package (the one llama.cpp's own converter uses) under llama.cpp's tensor names:

- `qwen3_moe` -> architecture `qwen3moe` (NEOX rope, q/k norms; no permutation);
- `mixtral`   -> architecture `llama` with experts (Mixtral), q and k permuted as llama.cpp's
  converter does for rope in pairs;
- `llama_dense` -> architecture `llama` without experts (a dense model, which a capture refuses).

Transformers 5 fuses each layer's experts (`mlp.experts.gate_up_proj` `[E, 2I, H]`, gate rows
first; `down_proj` `[E, H, I]`): they become `ffn_gate_exps`, `ffn_up_exps` and `ffn_down_exps`.
The vocabulary is a SentencePiece-style one (`tokenizer.ggml.model = llama`) of byte tokens and a
few pieces, enough for llama.cpp to load the model and tokenize any text by byte fallback; a
capture that compares with transformers feeds token ids (`--tokens`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ARCHS = ("qwen3_moe", "mixtral", "llama_dense")
PIECES = ["\u2581"] + list("etaoinshrdlucmfwypvbgkjqxz") + ["\u2581t", "\u2581a", "th", "he", "in", "er", "an", "re",
                                                         "on", "at", "en", "nd", "ti", "es"]


def config(arch: str, a):
    import transformers as t

    common = dict(vocab_size=a.vocab, hidden_size=a.hidden, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                  max_position_embeddings=max(a.ctx, 128), num_hidden_layers=a.layers, num_experts_per_tok=a.top_k,
                  tie_word_embeddings=False)
    if arch == "qwen3_moe":
        return t.Qwen3MoeConfig(**common, head_dim=a.hidden // a.heads, intermediate_size=2 * a.expert_ffn,
                                moe_intermediate_size=a.expert_ffn, num_experts=a.experts, decoder_sparse_step=1,
                                norm_topk_prob=True)
    if arch == "llama_dense":
        common.pop("num_experts_per_tok")
        return t.LlamaConfig(**common, intermediate_size=a.expert_ffn)
    return t.MixtralConfig(**common, intermediate_size=a.expert_ffn, num_local_experts=a.experts)


def build(arch: str, a):
    """The model of `arch` with seed a.seed, routers widened to N(0, 1)."""
    import torch
    import transformers

    torch.manual_seed(a.seed)
    model = transformers.AutoModelForCausalLM.from_config(config(arch, a)).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            if arch != "llama_dense":
                layer.mlp.gate.weight.normal_(0.0, 1.0)
    return model


def vocab(n: int):
    """(tokens, scores, types): <unk>, <s>, </s>, the 256 byte tokens, then pieces; n >= 259."""
    if n < 259:
        raise SystemExit(f"--vocab {n}: at least 259 (3 special and 256 byte tokens)")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    extra = PIECES + [f"\u2581w{i}" for i in range(max(0, n - 259 - len(PIECES)))]
    tokens += extra[: n - 259]
    types += [1] * (n - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(n - 259)]
    return tokens, scores, types


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k permutation for rope in pairs (HF's rotate_half -> GGML's NORM)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, arch: str, path: Path, a) -> None:
    import gguf

    cfg = model.config
    name = {"qwen3_moe": "qwen3moe", "mixtral": "llama", "llama_dense": "llama"}[arch]
    w = gguf.GGUFWriter(str(path), name)
    w.add_name(f"tiny-{arch}-random")
    w.add_context_length(a.ctx)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    if arch != "llama_dense":
        w.add_expert_count(a.experts)
        w.add_expert_used_count(a.top_k)
    if arch == "qwen3_moe":
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[a.type]
    w.add_file_type(ftype)
    tokens, scores, types = vocab(cfg.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    big = np.float16 if a.type == "f16" else np.float32

    def put(name: str, arr: np.ndarray) -> None:
        # Norms and other 1-D tensors stay f32, as llama.cpp's converter keeps them.
        if arr.ndim > 1 and a.type == "q8_0":
            if arr.shape[-1] % 32:
                raise SystemExit(f"--type q8_0: {name} has rows of {arr.shape[-1]}, not a multiple of 32")
            q = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            return
        w.add_tensor(name, np.ascontiguousarray(arr.astype(np.float32 if arr.ndim == 1 else big)))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    put("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if arch != "qwen3_moe":
            q, k = permute(q, cfg.num_attention_heads), permute(k, cfg.num_key_value_heads)
        put(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", q)
        put(f"blk.{i}.attn_k.weight", k)
        put(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        if arch == "qwen3_moe":
            put(f"blk.{i}.attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            put(f"blk.{i}.attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        put(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if arch == "llama_dense":
            for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
                put(f"blk.{i}.{ours}.weight", sd[p + f"mlp.{theirs}.weight"])
            continue
        # The router stays f32 whatever the type, so both runtimes route on the same logits.
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", np.ascontiguousarray(sd[p + "mlp.gate.weight"]))
        gate_up = sd[p + "mlp.experts.gate_up_proj"]
        inter = gate_up.shape[1] // 2
        put(f"blk.{i}.ffn_gate_exps.weight", gate_up[:, :inter, :])
        put(f"blk.{i}.ffn_up_exps.weight", gate_up[:, inter:, :])
        put(f"blk.{i}.ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make(arch: str, out_dir: Path, a) -> dict:
    """Writes out_dir/hf (the checkpoint) and out_dir/<arch>.gguf; returns their paths and shape."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build(arch, a)
    model.save_pretrained(out_dir / "hf")
    gguf_path = out_dir / f"{arch}.gguf"
    write_gguf(model, arch, gguf_path, a)
    return {"arch": arch, "gguf": str(gguf_path), "hf": str(out_dir / "hf"), "experts": a.experts, "top_k": a.top_k,
            "layers": a.layers, "hidden": a.hidden, "type": a.type}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=ARCHS, default="qwen3_moe")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--expert-ffn", type=int, default=16, help="each expert's intermediate size")
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--type", choices=("f32", "f16", "q8_0"), default="f32", help="weight type of the matrices")
    p.add_argument("--seed", type=int, default=0)
    return p


def main() -> None:
    a = parser().parse_args()
    print(json.dumps(make(a.arch, a.out_dir, a)))


if __name__ == "__main__":
    main()
