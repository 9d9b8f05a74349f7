"""Write a GGUF file (llama.cpp layout) from a tiny transformers Llama checkpoint, with the `gguf` package.

Test-only: real GGUF files come from llama.cpp's converter; this writes the same keys and tensor names
for the Llama architecture (q/k rows permuted the way llama.cpp stores them; transformers undoes it)
and a byte-level BPE tokenizer (`tokenizer.ggml.model = gpt2`) with merges and an optional chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """[n_head * D, in] rows reordered from rotate-half pairs to llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf.split(".", 3)  # model.layers.{i}.{rest}
    return f"blk.{i}.{LAYER_NAMES[rest]}"


def write_llama_gguf(checkpoint: Path, out: Path, qtype: str = "F32", chat_template: str | None = None) -> Path:
    """checkpoint: a transformers LlamaForCausalLM directory with tokenizer.json. qtype: F32, Q8_0 or Q4_0."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((checkpoint / "config.json").read_text())
    tok = json.loads((checkpoint / "tokenizer.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000.0)}
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type({"F32": 0, "Q8_0": 7, "Q4_0": 2}[qtype])
    _add_tokenizer(w, tok, cfg, chat_template)
    tensors = load_file(str(checkpoint / "model.safetensors"))
    for name, t in tensors.items():
        t = t.astype(np.float32)
        if name.endswith("q_proj.weight"):
            t = llama_cpp_permute(t, heads)
        elif name.endswith("k_proj.weight"):
            t = llama_cpp_permute(t, kv_heads)
        _add_tensor(w, gguf_name(name), t, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _add_tensor(w, name: str, t: np.ndarray, qtype: str) -> None:
    import gguf

    if qtype == "F32" or t.ndim < 2:  # norms stay F32, as llama.cpp writes them
        w.add_tensor(name, t)
        return
    kind = getattr(gguf.GGMLQuantizationType, qtype)
    w.add_tensor(name, gguf.quants.quantize(t, kind), raw_dtype=kind)


def _add_tokenizer(w, tok: dict, cfg: dict, chat_template: str | None) -> None:
    vocab = dict(tok["model"]["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control, 1: normal
    w.add_token_merges(merges)
    w.add_eos_token_id(int(cfg["eos_token_id"]))
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
