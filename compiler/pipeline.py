"""`compile_bundle`: Hugging Face checkpoints -> a validated, self-describing ONNX bundle.

Steps (each a small function in this package): open checkpoints -> check vocabularies -> export each
model to ONNX -> validate against PyTorch -> copy configs and tokenizer -> write manifest. Everything is
written into a temporary sibling directory that is renamed into place only when all steps succeeded.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from .. import BUNDLE_FORMAT_VERSION, __version__
from ..bundle.manifest import FORMAT_NAME, MANIFEST, file_entries
from ..models.checkpoint import Checkpoint, open_checkpoint
from ..core.errors import CheckpointError, InvalidArgument
from ..bundle import graph_io
from .export import ONNX_IR_VERSION, ONNX_OPSET, onnx_from_decoder
from ..bundle.profiles import profiles_for_model
from .tokenizer_check import check_same_vocab, load_vocab
from .validate import validate_onnx, validation_shapes
from .quantize_step import QuantizePlan, apply_quantization, resolve_plan

MAX_DRAFT_TOKENS_LIMIT = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def check_compile_args(max_seq_len: int, max_draft_tokens: int, out: Path, force: bool) -> None:
    if max_seq_len < 2:
        raise InvalidArgument(f"--max-seq-len must be at least 2, got {max_seq_len}")
    if not 1 <= max_draft_tokens <= MAX_DRAFT_TOKENS_LIMIT:
        raise InvalidArgument(
            f"--max-draft-tokens must be in [1, {MAX_DRAFT_TOKENS_LIMIT}], got {max_draft_tokens}"
        )
    if max_draft_tokens + 2 > max_seq_len:
        raise InvalidArgument(f"--max-draft-tokens {max_draft_tokens} leaves no room in --max-seq-len {max_seq_len}")
    if out.exists() and not force:
        raise InvalidArgument(f"output directory {out} already exists: pass --force to replace it")


def check_context(ck: Checkpoint, max_seq_len: int, role: str) -> None:
    c = ck.config
    if c.family == "gpt2" and max_seq_len > c.max_position_embeddings:
        raise InvalidArgument(
            f"--max-seq-len {max_seq_len} exceeds the {role}'s learned positions (n_positions="
            f"{c.max_position_embeddings})"
        )
    if c.sliding_window and max_seq_len > c.sliding_window:
        raise CheckpointError(
            f"{role} uses sliding-window attention ({c.sliding_window}); --max-seq-len {max_seq_len} beyond "
            "the window is not supported: pass --max-seq-len <= the window"
        )


def model_entry(role: str, ck: Checkpoint, max_seq_len: int, max_draft_tokens: int,
                validation: dict, num_parameters: int) -> dict[str, Any]:
    c = ck.config
    layers = c.num_layers
    kv = [1, "P", c.num_kv_heads, c.head_dim]
    inputs = [{"name": graph_io.INPUT_IDS, "dtype": "int64", "shape": [1, "S"]},
              {"name": graph_io.POSITION_IDS, "dtype": "int64", "shape": [1, "S"]}]
    outputs = [{"name": graph_io.LOGITS, "dtype": "float32", "shape": [1, "S", c.vocab_size]},
               {"name": graph_io.HIDDEN_STATES, "dtype": "float32", "shape": [1, "S", c.hidden_size]}]
    for i in range(layers):
        inputs += [{"name": n, "dtype": "float32", "shape": kv} for n in (graph_io.past_key(i), graph_io.past_value(i))]
        outputs += [{"name": n, "dtype": "float32", "shape": [1, "S", c.num_kv_heads, c.head_dim]}
                    for n in (graph_io.new_key(i), graph_io.new_value(i))]
    return {
        "architecture": c.architecture,
        "config": f"{role}/config.json",
        "decoder_config": c.to_dict(),
        "vocab_size": c.vocab_size,
        "eos_token_ids": list(c.eos_token_ids),
        "bos_token_id": c.bos_token_id,
        "num_parameters": num_parameters,
        "onnx": f"{role}/model.onnx",
        "onnx_data": f"{role}/model.onnx.data",
        "dtype": "float32",
        "inputs": inputs,
        "outputs": outputs,
        "profiles": profiles_for_model(c, max_seq_len, max_draft_tokens),
        "validation": validation,
    }


def _noop_progress(description: str) -> Callable[[], None]:
    return lambda: None


def compile_bundle(
    target: str | Path,
    out: str | Path,
    draft: str | Path | None = None,
    *,
    max_seq_len: int = 2048,
    max_draft_tokens: int = 8,
    force: bool = False,
    progress: Callable[[str], Callable[[], None]] | None = None,
    extra_steps: list[Callable[[Path, dict], None]] | None = None,
    quantization: QuantizePlan | None = None,
) -> Path:
    """Compile `target` (and optionally `draft`) into the bundle directory `out`. Returns `out`.

    `progress(description)` is called when a step starts and returns a callable invoked when it ends.
    `extra_steps` run inside the temporary directory before the manifest is written (Medusa, engines).
    `quantization` quantizes models (compiler/quantize_step.py); `draft="self:int4"` (or "self:int8") makes
    the quantized target the draft model.
    """
    out = Path(out)
    quantization, draft = resolve_plan(quantization, draft)
    progress = progress or _noop_progress
    check_compile_args(max_seq_len, max_draft_tokens, out, force)
    roles: dict[str, Checkpoint] = {"target": open_checkpoint(target)}
    if draft is not None:
        roles["draft"] = open_checkpoint(draft)
        vocab_size = check_same_vocab(roles["target"].tokenizer_path, roles["draft"].tokenizer_path)
    else:
        vocab_size = len(load_vocab(roles["target"].tokenizer_path))
    for role, ck in roles.items():
        check_context(ck, max_seq_len, role)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": BUNDLE_FORMAT_VERSION,
            "specrt_version": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch_version": torch.__version__,
            "onnx": {"opset": ONNX_OPSET, "ir_version": ONNX_IR_VERSION},
            "max_seq_len": max_seq_len,
            "max_draft_tokens": max_draft_tokens,
            "batch_size": 1,
            "models": {},
            "engines": {},
        }
        shapes = validation_shapes(max_seq_len, max_draft_tokens)
        for role, ck in roles.items():
            (tmp / role).mkdir()
            done = progress(f"load {role} ({ck.config.architecture})")
            decoder = ck.load_decoder(torch.float32)
            n_params = sum(p.numel() for p in decoder.parameters())
            done()
            done = progress(f"export {role} to ONNX")
            onnx_path = onnx_from_decoder(decoder, tmp / role / "model.onnx")
            done()
            done = progress(f"validate {role} against PyTorch")
            stats = validate_onnx(decoder, onnx_path, shapes)
            done()
            for name in ("config.json", "generation_config.json"):
                if (ck.path / name).exists():
                    shutil.copy2(ck.path / name, tmp / role / name)
            manifest["models"][role] = model_entry(role, ck, max_seq_len, max_draft_tokens, stats, n_params)
            del decoder
        (tmp / "tokenizer").mkdir()
        for name in TOKENIZER_FILES:
            if (roles["target"].path / name).exists():
                shutil.copy2(roles["target"].path / name, tmp / "tokenizer" / name)
        t = roles["target"].config
        manifest["tokenizer"] = {
            "path": "tokenizer/tokenizer.json",
            "config": "tokenizer/tokenizer_config.json" if (tmp / "tokenizer/tokenizer_config.json").exists() else None,
            "vocab_size": vocab_size,
            "eos_token_ids": list(t.eos_token_ids),
            "bos_token_id": t.bos_token_id,
        }
        if quantization is not None:
            apply_quantization(quantization, tmp, manifest, progress)
        for step in extra_steps or []:
            step(tmp, manifest)
        done = progress("checksum files and write manifest")
        manifest["files"] = file_entries(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        done()
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        return out
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
