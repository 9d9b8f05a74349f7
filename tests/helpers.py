"""Tiny real components for tests: a trained BPE tokenizer and random checkpoints saved by transformers."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

TEXT_SOURCES = ("os", "json", "textwrap", "argparse")


def corpus_text() -> str:
    import importlib

    return "\n".join(Path(importlib.import_module(m).__file__).read_text() for m in TEXT_SOURCES)


def train_tokenizer(path: Path, vocab_size: int = 320, bos: bool = False) -> Path:
    """Byte-level BPE trained in a second on stdlib source; EOS is `<eos>` (id 0), optional `<bos>` (id 1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    special = ["<eos>", "<bos>"] if bos else ["<eos>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus_text()], trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def hf_config(arch: str, vocab: int, layers: int = 2, hidden: int = 64, seed_variant: str = ""):
    """A transformers config for a tiny model of `arch` (see ARCH_CASES)."""
    import transformers as tf

    # initializer_range 0.1 (not 0.02): logits spread out, so argmax near-ties are unlikely
    common = dict(vocab_size=vocab, eos_token_id=0, bos_token_id=None, pad_token_id=None, initializer_range=0.1)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=512, **common)
    kw = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, **common)
    if arch == "llama":
        return tf.LlamaConfig(**kw)
    if arch == "llama_tied_llama3":
        return tf.LlamaConfig(tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **kw)
    if arch == "llama_linear_legacy":
        return tf.LlamaConfig(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, **kw)
    if arch == "mistral":
        return tf.MistralConfig(sliding_window=4096, **kw)
    if arch == "qwen2":
        return tf.Qwen2Config(**kw)
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=32, **kw)
    if arch.startswith("gemma3"):
        return gemma3_config(arch, kw)
    if arch == "phi3":  # qkv_proj / gate_up_proj in the checkpoint
        return tf.Phi3Config(**kw)
    if arch == "phi3_longrope":  # Phi-3 128k's rope: per-dimension short / long factors, attention factor from 512 / 64
        half = kw["hidden_size"] // kw["num_attention_heads"] // 2
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.25 * i for i in range(half)],
                "long_factor": [2.0 + i for i in range(half)], "original_max_position_embeddings": 64}
        return tf.Phi3Config(rope_parameters=rope, original_max_position_embeddings=64, **kw)
    if arch == "phi3_partial":  # Phi-4 mini's form: the rope turns part of each head (half), longrope, tied
        half = kw["hidden_size"] // kw["num_attention_heads"] // 4
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                "short_factor": [1.0 + 0.5 * i for i in range(half)], "long_factor": [3.0] * half,
                "original_max_position_embeddings": 64}
        return tf.Phi3Config(rope_parameters=rope, original_max_position_embeddings=64, tie_word_embeddings=True, **kw)
    if arch == "granite":  # the four scalars away from 1 (released 3.x: 12, 0.22, 1/64, 8), tied
        return tf.GraniteConfig(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
                                logits_scaling=2.5, tie_word_embeddings=True, **kw)
    if arch == "smollm3":  # layer 3 of 4 without rope (no_rope_layer_interval 4), tied
        return tf.SmolLM3Config(**kw)
    if arch == "gemma2":  # transformers' default layer_types (every other layer sliding), scores soft-capped
        return tf.Gemma2Config(head_dim=32, sliding_window=GEMMA3_WINDOW, query_pre_attn_scalar=24,
                               attn_logit_softcapping=1.5, final_logit_softcapping=8.0, **kw)
    raise ValueError(arch)


GEMMA3_WINDOW = 6  # shorter than every test context, so prefill, decode and verify cross it


def gemma3_config(arch: str, kw: dict):
    """Tiny Gemma 3: sliding layers around a global one, per-type rope (linear scaling on the global layers),
    query_pre_attn_scalar != head_dim, final logit soft-capping; tied embeddings unless `_untied`."""
    import transformers as tf

    layers = kw["num_hidden_layers"]
    types = ["full_attention" if i % 3 == 1 else "sliding_attention" for i in range(layers)]
    rope = {"full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    return tf.Gemma3TextConfig(head_dim=32, sliding_window=GEMMA3_WINDOW, layer_types=types, rope_parameters=rope,
                               query_pre_attn_scalar=24, final_logit_softcapping=8.0,
                               tie_word_embeddings=not arch.endswith("_untied"), **kw)


def _gemma3_legacy_config(raw: dict) -> dict:
    """The older Gemma 3 config.json form (Gemma 3 1B): rope_theta + rope_local_base_freq + rope_scaling, and
    sliding_window_pattern instead of layer_types."""
    rope = raw.pop("rope_parameters")
    types = raw.pop("layer_types")
    raw.pop("_sliding_window_pattern", None)
    pattern = types.index("full_attention") + 1 if "full_attention" in types else len(types) + 1
    assert types == ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(len(types))]
    raw["sliding_window_pattern"] = pattern
    raw["rope_theta"] = rope["full_attention"]["rope_theta"]
    raw["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    raw["rope_scaling"] = {"rope_type": "linear", "factor": rope["full_attention"]["factor"]}
    return raw


ARCH_CASES = ("llama", "llama_tied_llama3", "llama_linear_legacy", "mistral", "qwen2", "qwen3", "gpt2")


def make_checkpoint(path: Path, arch: str, tokenizer: Path, layers: int = 2, hidden: int = 64, seed: int = 0,
                    shards: bool = False) -> Path:
    """Save a random `arch` model with transformers (safetensors) plus the tokenizer into `path`."""
    import shutil

    import torch
    import transformers as tf

    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    torch.manual_seed(seed)
    config = hf_config(arch, vocab, layers, hidden)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    if arch.startswith("gemma"):  # transformers starts Gemma's (1 + w) norms at w = 0: make them matter
        import torch

        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.3)
    model.save_pretrained(str(path), max_shard_size="40KB" if shards else "5GB")
    shutil.copy(tokenizer, path / "tokenizer.json")
    if arch == "llama_linear_legacy":  # rewrite the rope block in the older top-level form
        raw = json.loads((path / "config.json").read_text())
        rope = raw.pop("rope_parameters")
        raw["rope_theta"] = rope["rope_theta"]
        raw["rope_scaling"] = {"type": "linear", "factor": rope["factor"]}
        (path / "config.json").write_text(json.dumps(raw, indent=2))
    if arch.endswith("_legacy") and arch.startswith("gemma3"):
        raw = _gemma3_legacy_config(json.loads((path / "config.json").read_text()))
        (path / "config.json").write_text(json.dumps(raw, indent=2))
    return path


def run_cli(*args, cwd=None, env=None, input=None):
    """`specrt ARGS` run in this process through click's CliRunner: the exit code, stdout and stderr that
    `python -m specrt ARGS` gives, without a new interpreter (each one imports torch: seconds on a busy
    machine). Arguments are str()-ed, bytes decoded as the interpreter decodes argv (surrogateescape).
    Returns a subprocess.CompletedProcess (text). Keep real subprocesses for what the process itself does:
    signals, races between processes, the `python -m specrt` entry point, imports."""
    import os
    import subprocess

    from click.testing import CliRunner

    from specrt.cli import main

    argv = [os.fsdecode(a) if isinstance(a, (bytes, bytearray)) else str(a) for a in args]
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, argv, env=env, input=input, catch_exceptions=False, prog_name="specrt")
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, result.stderr)


def event_tokens(events) -> list[int]:
    """Every token a request submitted to a BatchEngine emits (its event queue), until it ends; raises its error."""
    ids = []
    while True:
        ev = events.get(timeout=120)
        if isinstance(ev, BaseException):
            raise ev
        if not isinstance(ev, tuple):
            return ids
        ids.extend(ev[1])


def fixed_costs(sched, monkeypatch, table):
    """`table` (a CostTable) as the batch scheduler's cost table, with no calibration of its predictions against
    realized steps (which would undo a made-up table: `FamilyChooser.plan` would stop drafting where the real passes
    say so). `monkeypatch` puts the old table back after the test; it is returned for a test that swaps tables
    within itself."""
    from specrt.runtime.batch import family

    monkeypatch.setattr(family, "CALIBRATION_DECAY", 1.0)
    monkeypatch.setattr(sched.chooser, "calibration", {"fused": 1.0, "packed": 1.0})
    monkeypatch.setattr(sched.chooser, "spec_calibration", {"fused": 1.0, "packed": 1.0})
    saved = sched.costs
    monkeypatch.setattr(sched, "costs", table)
    return saved


class FakeClock:
    """Stands in for the `time` module of code that times its calls (`monkeypatch.setattr(module, "time", clock)`):
    `perf_counter` reads a counter that only `sleep` advances, so measured durations are exact on any machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@contextlib.contextmanager
def resolve_counts(monkeypatch):
    """Counts of the functions that resolve a call: the request (`Generator.request`), the bundle checks of the
    request (method available, k bounds: `check_for`), the prompt's ids (`prompt_ids`), the context check
    (`context_room`) and the batch's own check of the method (`intake.refusal`)."""
    from specrt.runtime import GenerationRequest, generator, prepared
    from specrt.runtime.batch import intake

    counts = dict.fromkeys(("request", "check_for", "prompt_ids", "context", "batch_check"), 0)

    def spy(owner, name, key):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    spy(generator.Generator, "request", "request")
    spy(GenerationRequest, "check_for", "check_for")
    spy(generator, "prompt_ids", "prompt_ids")
    spy(prepared, "context_room", "context")
    spy(intake, "refusal", "batch_check")
    yield counts


def oracle_head_target(path: Path, tokenizer: Path):
    """A one-layer Llama whose attention output is zero and whose embedding is fp16-exact, so a draft head that only
    reads the embedding of token t + 1 predicts it exactly (the draft-head tests' oracle): (checkpoint dir, decoder)."""
    import torch
    from safetensors.torch import load_file, save_file

    from specrt.models.checkpoint import open_checkpoint

    target = make_checkpoint(path, "llama", tokenizer, layers=1, seed=3)
    weights = load_file(str(target / "model.safetensors"))
    for name in list(weights):
        if name.endswith("o_proj.weight"):
            weights[name] = torch.zeros_like(weights[name])
        if name.endswith("embed_tokens.weight"):  # the head keeps its embedding in fp16: make that exact
            weights[name] = weights[name].half().float()
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target, open_checkpoint(target).load_decoder(torch.float32)


def fp32_decoder(path: Path):
    """The checkpoint at `path` as an fp32 PyTorch decoder in eval mode, no gradients (the head tests' target)."""
    import torch

    from specrt.models.checkpoint import open_checkpoint

    return open_checkpoint(path).load_decoder(torch.float32).eval().requires_grad_(False)


def random_fused_head(decoder, layers: tuple[int, ...], seed: int = 0, scale: float = 0.2):
    """A fused draft head on `decoder` reading `layers`, its trained parameters moved by seeded noise of `scale`
    (so fp16 / int8 storage and the graphs have something non-trivial to keep)."""
    import torch

    from specrt.models.draft_head_fused import FusedDraftHead

    torch.manual_seed(seed)
    head = FusedDraftHead(decoder, torch.arange(decoder.config.vocab_size), layers)
    with torch.no_grad():
        for p in head.trained_parameters():
            p.add_(torch.randn_like(p) * scale)
    return head


GREEDY_PROMPTS = ("def main(argv):\n    ", "import json\nimport json\nimport json\nimport")


def assert_greedy_matches_transformers(checkpoint: Path, bundle: Path, methods, backends=("ort",),
                                       new_tokens: int = 24) -> None:
    """Every method's greedy tokens from `bundle` (each backend) equal transformers' `generate` on `checkpoint`."""
    import torch
    import transformers

    from specrt.runtime import load

    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    for backend in backends:
        gen = load(bundle, backend=backend)
        for prompt in GREEDY_PROMPTS:
            ids = gen.tokenizer.encode(prompt)
            with torch.no_grad():
                out = hf.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=0,
                                  pad_token_id=0)
            expected = out[0, len(ids):].tolist()
            for method in methods:
                res = gen.generate(prompt, new_tokens, method=method)
                assert res.token_ids == expected, (backend, method, prompt)


def assert_logits_match_transformers(checkpoint: Path, length: int = 30, tol: float = 1e-4):
    """One forward of `length` random tokens: the PyTorch reference's logits equal transformers' (atol = rtol =
    `tol`). Returns the reference decoder."""
    import torch
    import transformers

    from specrt.models import empty_past
    from specrt.models.checkpoint import open_checkpoint

    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    ours = open_checkpoint(checkpoint).load_decoder()
    ids = torch.randint(0, ours.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        got = ours(ids, torch.arange(length)[None], *empty_past(ours.config)).logits
    assert torch.allclose(got, ref, atol=tol, rtol=tol), (checkpoint, (got - ref).abs().max())
    return ours
