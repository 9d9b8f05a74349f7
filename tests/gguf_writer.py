"""Write GGUF files (llama.cpp layout) from tiny transformers checkpoints, with the `gguf` package: Llama,
Mistral, Qwen2, Qwen3 and Gemma 3; and read one back with transformers (`transformers_greedy`, the reference the
GGUF tests compare bundles with).

Test-only: real GGUF files come from llama.cpp's converter; this writes the same keys and tensor names.
Tensor names come from the `gguf` package's own name map (`get_tensor_name_map`, the table llama.cpp's
converter uses); the conventions llama.cpp's converter applies per architecture are repeated here:
  * Llama / Mistral: q/k rows permuted to interleaved rope pairs (transformers undoes it);
  * Qwen2 / Qwen3 / Gemma 3: NEOX rope, no permutation;
  * Gemma 3: every norm weight is stored as 1 + w (llama.cpp multiplies by w; transformers subtracts 1);
  * Mistral: llama.cpp writes it as architecture "llama" (so transformers reads it as Llama), except that
    transformers routes a file whose general.name is exactly "mistral" to a Mistral tensor map.
Metadata keys are the ones llama.cpp writes (context/embedding/feed-forward lengths, head counts, rope base,
rms epsilon; key_length for Qwen3 and Gemma 3, the sliding window for Gemma 3). The tokenizer is byte-level
BPE (`tokenizer.ggml.model = gpt2`) with merges and an optional chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """[n_head * D, in] rows reordered from rotate-half pairs to llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "mistral": "llama", "llama": "llama"}


def _name_map(arch: str, layers: int):
    import gguf

    key = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    return gguf.get_tensor_name_map(key, layers)


def _gguf_tensor_name(name_map, hf: str) -> str:
    base, suffix = hf.rsplit(".", 1)
    mapped = name_map.get_name(base)
    if mapped is None:
        raise KeyError(f"no GGUF name for {hf}")
    return f"{mapped}.{suffix}"


def _metadata(w, cfg: dict, model_type: str) -> None:
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    if model_type == "gemma3_text":
        rope = rope.get("full_attention", rope)
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    if model_type in ("llama", "mistral"):
        w.add_rope_dimension_count(head_dim)
    if model_type in ("qwen3", "gemma3_text"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if model_type == "gemma3_text":
        w.add_sliding_window(cfg["sliding_window"])


def _convert(name: str, t: np.ndarray, model_type: str, cfg: dict) -> np.ndarray:
    if model_type in ("llama", "mistral"):
        if name.endswith("q_proj.weight"):
            return llama_cpp_permute(t, cfg["num_attention_heads"])
        if name.endswith("k_proj.weight"):
            return llama_cpp_permute(t, cfg["num_key_value_heads"])
    if model_type == "gemma3_text" and name.endswith("norm.weight"):
        return t + 1.0
    return t


def write_gguf(checkpoint: Path, out: Path, qtype: str = "F32", chat_template: str | None = None,
               name: str | None = None, drop=(), meta: dict | None = None, tensor_hook=None,
               types: dict | None = None, tokenizer: str = "gpt2") -> Path:
    """checkpoint: a transformers directory (config.json, model.safetensors, tokenizer.json) of a model_type in
    GGUF_ARCH. qtype: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K or Q6_K (matrices only; norms and
    biases stay F32, as llama.cpp writes them; K-quants need rows of a multiple of 256 values).
    types: {GGUF tensor name: qtype} overrides per tensor (mixed files: llama.cpp's Q4_K_M keeps
    token_embd/output in Q6_K). tokenizer: "gpt2" (byte-level BPE) or "llama" (SentencePiece pieces with
    byte fallback, built from the checkpoint's vocabulary).
    name: general.name (llama.cpp writes the model's name there).
    For hostile files: `drop` GGUF tensor names to leave out ("*" for all), `meta` {key: (value, GGUFValueType)}
    written instead of the key's usual value, `tensor_hook(gguf_name, array) -> array` edits weights."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((checkpoint / "config.json").read_text())
    tok = json.loads((checkpoint / "tokenizer.json").read_text())
    model_type = cfg["model_type"]
    arch = GGUF_ARCH[model_type]
    w = gguf.GGUFWriter(str(out), arch)
    if name is not None:
        w.add_name(name)
    _metadata(w, cfg, model_type)
    w.add_file_type(FILE_TYPES[qtype])
    (_add_llama_tokenizer if tokenizer == "llama" else _add_tokenizer)(w, tok, cfg, chat_template)
    for key, (value, vtype) in (meta or {}).items():
        for kv in w.kv_data:
            kv.pop(key, None)
        w.add_key_value(key, value, vtype)
    names = _name_map(arch, cfg["num_hidden_layers"])
    for name, t in load_file(str(checkpoint / "model.safetensors")).items():
        t = _convert(name, t.astype(np.float32), model_type, cfg)
        gname = _gguf_tensor_name(names, name)
        if gname in drop or "*" in drop:
            continue
        _add_tensor(w, gname, tensor_hook(gname, t) if tensor_hook else t, (types or {}).get(gname, qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_llama_gguf(checkpoint: Path, out: Path, qtype: str = "F32", chat_template: str | None = None) -> Path:
    """A transformers Llama checkpoint as GGUF (qtype: F32, Q8_0 or Q4_0)."""
    return write_gguf(checkpoint, out, qtype, chat_template)


# general.file_type (llama.cpp's LlamaFileType) of a file whose matrices are mostly `qtype`
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q6_K": 18, "Q4_K": 15,
              "BF16": 32}


def _add_tensor(w, name: str, t: np.ndarray, qtype: str) -> None:
    import gguf

    from gguf_kquants import ENCODERS, encode

    if qtype == "F32" or t.ndim < 2:  # norms stay F32, as llama.cpp writes them
        w.add_tensor(name, t)
        return
    if qtype == "F16":
        w.add_tensor(name, t.astype(np.float16))
        return
    kind = getattr(gguf.GGMLQuantizationType, qtype)
    data = encode(t, qtype) if qtype in ENCODERS else gguf.quants.quantize(t, kind)
    w.add_tensor(name, data, raw_dtype=kind)


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


def _add_llama_tokenizer(w, tok: dict, cfg: dict, chat_template: str | None) -> None:
    """tokenizer.ggml.model = llama (SentencePiece): <unk>, <s>, </s>, the 256 byte-fallback pieces <0xXX>,
    then the checkpoint's BPE tokens as pieces ("Ġ" -> "▁"), scored by rank, up to the model's vocab size."""
    size = cfg["vocab_size"]
    tokens, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]  # 2: unknown, 3: control, 6: byte, 1: normal
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    seen = set(tokens)
    for piece, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1]):
        piece = piece.replace("\u0120", "\u2581")
        if len(tokens) >= size:
            break
        if piece not in seen and not piece.startswith("<"):
            seen.add(piece)
            tokens.append(piece)
            types.append(1)
    while len(tokens) < size:
        tokens.append(f"<extra_{len(tokens)}>")
        types.append(4)  # user-defined
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    if chat_template is not None:
        w.add_chat_template(chat_template)


def transformers_greedy(gguf_file, prompt_ids, n):
    """transformers' own greedy continuation (n tokens, EOS not stopping) of `prompt_ids`, reading the GGUF file."""
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                    dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()
