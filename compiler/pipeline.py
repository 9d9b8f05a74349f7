"""`compile_bundle`: Hugging Face checkpoints -> a validated, self-describing ONNX bundle.

Steps (each a small function in this package): open checkpoints -> check vocabularies -> export each
model to ONNX -> validate against PyTorch -> copy configs and tokenizer -> write manifest. Everything is
written into a temporary sibling directory that is renamed into place only when all steps succeeded.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from specrt.bundle.entries import GraphVariant, ModelEntry, TensorSpec
from specrt.bundle.parts import TokenizerEntry
from specrt.bundle.writer import ManifestDraft, write_manifest
from specrt.models.checkpoint import Checkpoint
from specrt.models.config_files import read_json
from specrt.core.errors import CheckpointError, InvalidArgument
from specrt.bundle import graph_io
from specrt.compiler.output_dir import staged_output
from specrt.compiler.os_errors import compile_os_error
from specrt.compiler.output_temp import release_temp
from specrt.compiler.export import ONNX_IR_VERSION, ONNX_OPSET, onnx_from_decoder
from specrt.bundle.profiles import profiles_for_model
from specrt.compiler.tokenizer_check import check_chat_template, check_fits_model, check_same_vocab, load_vocab
from specrt.compiler.validate import Tolerance, validate_onnx, validation_shapes, window_shapes
from specrt.compiler.logit_rows import add_logit_start, validate_logit_start
from specrt.compiler.input_defaults import add_past_lengths_default, graph_has_input
from specrt.compiler.past_lengths import validate_past_lengths
from specrt.compiler.portable_graph import clean_portable_graph
from specrt.compiler.lean import lean_bundle
from specrt.compiler.variants import fused_variant
from specrt.compiler.quantize_step import QuantizePlan, apply_quantization
from specrt.compiler.preflight import preflight
from specrt.compiler.sources import SOURCES, open_source
from specrt.compiler.spec import CompileSpec

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def check_context(ck: Checkpoint, max_seq_len: int, role: str) -> None:
    c = ck.config
    if c.family == "gpt2" and max_seq_len > c.max_position_embeddings:
        raise InvalidArgument(
            f"--max-seq-len {max_seq_len} exceeds the {role}'s learned positions (n_positions="
            f"{c.max_position_embeddings})"
        )
    ropes = [r for r in (c.rope, c.local_rope) if r is not None]
    if any(r.rope_type == "dynamic" for r in ropes) and max_seq_len > c.max_position_embeddings:
        raise CheckpointError(
            f"{role} uses dynamic (NTK) rope scaling, which rescales past max_position_embeddings="
            f"{c.max_position_embeddings}: pass --max-seq-len <= {c.max_position_embeddings}"
        )
    longrope = next((r for r in ropes if r.rope_type == "longrope"), None)
    if longrope is not None and max_seq_len > longrope.original_max_position_embeddings:
        n = longrope.original_max_position_embeddings
        raise CheckpointError(
            f"{role} uses longrope scaling, which transformers switches to its long factors (other frequencies for "
            f"the whole sequence) past original_max_position_embeddings={n}: pass --max-seq-len <= {n}")
    if c.sliding_window and not c.windowed and max_seq_len > c.sliding_window:  # Gemma 3 masks in the graph
        raise CheckpointError(
            f"{role} uses sliding-window attention ({c.sliding_window}); --max-seq-len {max_seq_len} beyond "
            "the window is not supported: pass --max-seq-len <= the window"
        )


def chat_template_file(tokenizer_dir: Path) -> str | None:
    """Which copied file holds the chat template (chat_template.jinja wins, as in transformers)."""
    if (tokenizer_dir / "chat_template.jinja").is_file():
        return "tokenizer/chat_template.jinja"
    cfg = tokenizer_dir / "tokenizer_config.json"
    if cfg.is_file() and read_json(cfg).get("chat_template"):  # checked before export: check_chat_template
        return "tokenizer/tokenizer_config.json"
    return None


def model_entry(role: str, ck: Checkpoint, max_seq_len: int, max_draft_tokens: int,
                validation: dict, num_parameters: int, source: dict[str, Any] | None = None,
                past_lengths: bool = True, tree: bool = False, feature_layers: tuple[int, ...] = ()) -> ModelEntry:
    """The manifest entry of one model's portable graph; `past_lengths`: the graph has the batched input
    (compiler/past_lengths.py), recorded in its I/O and profiles."""
    c = ck.config
    kv = ("B", "P", c.num_kv_heads, c.head_dim)
    inputs = [TensorSpec(graph_io.INPUT_IDS, ("B", "S"), "int64"),
              TensorSpec(graph_io.POSITION_IDS, ("B", "S"), "int64")]
    outputs = [TensorSpec(graph_io.LOGITS, ("B", "S", c.vocab_size), "float32"),
               TensorSpec(graph_io.HIDDEN_STATES, ("B", "S", c.hidden_size), "float32")]
    for i in range(c.num_layers):
        inputs += [TensorSpec(n, kv, "float32") for n in (graph_io.past_key(i), graph_io.past_value(i))]
        outputs += [TensorSpec(n, ("B", "S", c.num_kv_heads, c.head_dim), "float32")
                    for n in (graph_io.new_key(i), graph_io.new_value(i))]
    if past_lengths:
        inputs.append(TensorSpec(graph_io.PAST_LENGTHS, ("B",), "int64"))
    if tree:  # a token tree's mask (docs/trees.md), default [[True]]
        inputs.append(TensorSpec(graph_io.TREE_MASK, ("tree_rows", "tree_cols"), "bool"))
    if feature_layers:  # a fused draft head's target layers (compiler/feature_layers.py)
        outputs.append(TensorSpec(graph_io.HIDDEN_LAYERS, ("B", "S", len(feature_layers), c.hidden_size), "float32"))
    return ModelEntry(
        role=role, architecture=c.architecture, config=f"{role}/config.json", decoder_config=c,
        vocab_size=c.vocab_size, eos_token_ids=tuple(c.eos_token_ids), bos_token_id=c.bos_token_id,
        num_parameters=num_parameters, onnx=f"{role}/model.onnx", onnx_data=f"{role}/model.onnx.data",
        dtype="float32", inputs=tuple(inputs), outputs=tuple(outputs),
        profiles=profiles_for_model(c, max_seq_len, max_draft_tokens, past_lengths=past_lengths, tree=tree),
        validation=validation,
        source=source or {"format": "hf"},
    )


def _noop_progress(description: str) -> Callable[[], None]:
    return lambda: None


def compile_bundle(spec: CompileSpec, *, progress: Callable[[str], Callable[[], None]] | None = None,
                   extra_steps: Iterable[Callable[[Path, ManifestDraft], None]] = ()) -> Path:
    """Compile the bundle `spec` describes (compiler/spec.py: targets, quantization, graph variants, Medusa,
    engines, tolerances) into `spec.output`. Returns the output path.

    Every check runs before any export (compiler/preflight.py); everything is written into a temporary sibling
    renamed into place at the end (`staged_output`: output rules, locking, cleanup, compiler/output_dir.py).
    `progress(description)` is called when a step starts and returns a callable invoked when it ends.
    `extra_steps(tmp, draft)` run last, inside the temporary directory, before the manifest is written: records
    that are not compile options (the demo marks its bundle; tests inject failures). Draft heads, Medusa heads
    and engines come from the spec.
    """
    if not isinstance(spec, CompileSpec):
        raise TypeError(f"compile_bundle takes one CompileSpec (specrt.compiler.spec), got {type(spec).__name__}")
    plan = preflight(spec)
    out = Path(os.path.abspath(spec.output))  # `-o ..` from inside a bundle: the real parent and name
    target, draft, quantization = spec.target, plan.draft, plan.quantization
    max_seq_len = spec.max_seq_len
    steps = [*plan.steps, *extra_steps]
    progress = progress or _noop_progress
    try:
        # the output rules (checked once more), the temporary sibling, SIGTERM as exit and the final rename
        with staged_output(out, spec.force) as tmp:
            roles, sources = {}, {}
            for role, path in (("target", target), ("draft", draft)):
                if path is not None:
                    roles[role], sources[role] = open_source(path, tmp / SOURCES / role, role, progress)
            if draft is not None:
                vocab_size = check_same_vocab(roles["target"].tokenizer_path, roles["draft"].tokenizer_path)
            else:
                vocab_size = len(load_vocab(roles["target"].tokenizer_path))
            for role, ck in roles.items():
                check_fits_model(ck.tokenizer_path, ck.config.vocab_size, role)
                check_context(ck, max_seq_len, role)
            check_chat_template(roles["target"].path)  # what the bundle's tokenizer/ will hold
            _compile_into(tmp, roles, sources, vocab_size, max_seq_len, spec.max_draft_tokens, spec.tolerance,
                          spec.ort_graph, quantization, progress, steps, spec.keep_fp32, spec.lm_head_screen,
                          plan.feature_layers)
    except OSError as exc:  # the output's (a full disk, a read-only directory) or an input's (compiler/os_errors.py)
        error = compile_os_error(exc, out)
        if error is None:
            raise
        raise error from None
    return out


def _compile_into(tmp: Path, roles: dict[str, Checkpoint], sources: dict[str, dict], vocab_size: int,
                  max_seq_len: int, max_draft_tokens: int, tolerance: Tolerance, ort_graph: str,
                  quantization: QuantizePlan | None, progress, extra_steps, keep_fp32: bool = False,
                  lm_head_screen: str = "auto", feature_layers: tuple[int, ...] = ()) -> None:
    """Every compile step, writing into the temporary directory `tmp` (manifest last); `feature_layers` (a fused
    draft head's): the target's graphs also output `hidden_layers` (compiler/feature_layers.py)."""
    # the screened head goes only into an fp32 fused graph that stays fp32 (quantizing reads that graph)
    q = quantization
    screen_modes = {"target": lm_head_screen if q is None or (q.target is None and q.self_draft is None) else "off",
                    "draft": lm_head_screen if q is None or q.draft is None else "off"}
    manifest = ManifestDraft(max_seq_len, max_draft_tokens, torch_version=torch.__version__,
                             onnx={"opset": ONNX_OPSET, "ir_version": ONNX_IR_VERSION})
    shapes = validation_shapes(max_seq_len, max_draft_tokens)
    for role, ck in roles.items():
        role_shapes = shapes + window_shapes(ck.config, max_seq_len, max_draft_tokens)
        (tmp / role).mkdir()
        done = progress(f"load {role} ({ck.config.architecture})")
        decoder = ck.load_decoder(torch.float32)
        n_params = sum(p.numel() for p in decoder.parameters())
        done()
        done = progress(f"export {role} to ONNX")
        layers = tuple(feature_layers) if role == "target" else ()
        onnx_path = onnx_from_decoder(decoder, tmp / role / "model.onnx", layers)
        done()
        done = progress(f"clean {role}'s portable graph")
        clean_portable_graph(onnx_path)
        done()
        has_logit_start = add_logit_start(onnx_path)
        has_past_lengths = add_past_lengths_default(onnx_path)  # and the tree_mask default
        has_tree = has_past_lengths and graph_has_input(onnx_path, graph_io.TREE_MASK)
        done = progress(f"validate {role} against PyTorch")
        stats = validate_onnx(decoder, onnx_path, role_shapes, tolerance)
        if has_logit_start:
            validate_logit_start(decoder, onnx_path, tolerance=tolerance)
        if has_past_lengths:
            stats["batched"] = validate_past_lengths(decoder, onnx_path, max_seq_len, tolerance)
        if layers:
            from specrt.compiler.feature_layers import validate_hidden_layers

            stats["hidden_layers"] = validate_hidden_layers(decoder, onnx_path, layers, False, tolerance=tolerance)
        done()
        for name in ("config.json", "generation_config.json"):
            if (ck.path / name).exists():
                shutil.copy2(ck.path / name, tmp / role / name)
        entry = model_entry(role, ck, max_seq_len, max_draft_tokens, stats, n_params, sources[role],
                            past_lengths=has_past_lengths, tree=has_tree, feature_layers=layers)
        optional = ((("logit_start",) if has_logit_start else ()) + ((graph_io.PAST_LENGTHS,) if has_past_lengths else ())
                    + ((graph_io.TREE_MASK,) if has_tree else ()))
        graphs = {"portable": GraphVariant(entry.onnx, entry.onnx_data, optional_inputs=optional)}
        skipped = None
        if ort_graph in ("fused", "both"):
            done = progress(f"build and validate {role}'s fused ONNX Runtime graph")
            fused, skipped = fused_variant(decoder, tmp / role, role, max_seq_len, role_shapes, tolerance,
                                           screen_modes[role], layers)
            done()
            if fused:
                graphs["fused"] = fused
        manifest.models[role] = dataclasses.replace(entry, graphs=graphs, fused_skipped=skipped)
        del decoder
    (tmp / "tokenizer").mkdir()
    for name in TOKENIZER_FILES:
        if (roles["target"].path / name).exists():
            shutil.copy2(roles["target"].path / name, tmp / "tokenizer" / name)
    t = roles["target"].config
    manifest.tokenizer = TokenizerEntry(
        path="tokenizer/tokenizer.json",
        config="tokenizer/tokenizer_config.json" if (tmp / "tokenizer/tokenizer_config.json").exists() else None,
        vocab_size=vocab_size,
        eos_token_ids=tuple(t.eos_token_ids),
        bos_token_id=t.bos_token_id,
        chat_template=chat_template_file(tmp / "tokenizer"),
    )
    if quantization is not None:
        apply_quantization(quantization, tmp, manifest, progress)
    for step in extra_steps or []:
        step(tmp, manifest)
    shutil.rmtree(tmp / SOURCES, ignore_errors=True)  # converted GGUF inputs: not part of the bundle
    lean_bundle(tmp, manifest, keep_fp32=keep_fp32, keep_portable=ort_graph != "fused")  # after every validation
    done = progress("checksum files and write manifest")
    release_temp(tmp)
    write_manifest(tmp, manifest)
    done()
