"""`DecoderConfig`: the subset of a Hugging Face `config.json` that the decoders need, validated.

Both the current `rope_parameters` form and the older top-level `rope_theta` / `rope_scaling` form are read.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from specrt.core.errors import CheckpointError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# rope types whose frequencies depend on the pretraining length (transformers' default for it, when a config omits
# `original_max_position_embeddings`, is `max_position_embeddings`)
USES_ORIGINAL_LENGTH = ("llama3", "yarn", "longrope")
LAYER_TYPES = ("sliding_attention", "full_attention")


def flag(raw: dict[str, Any], key: str, default: bool) -> bool:
    """A true/false field of config.json (absent: `default`; null, 0 and 1 as transformers reads them); a string
    such as "false" is refused: read as a truth value it would silently mean true."""
    value = raw.get(key, default)
    if value is None or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise CheckpointError(f"config.json: {key} must be true or false, got {value!r}")


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature factor, 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # yarn: cos and sin are multiplied by `attention_factor`; the ramp between interpolated and extrapolated
    # frequencies runs over the dimensions that turn beta_fast .. beta_slow times in the original length
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # longrope (Phi-3): frequencies divided by these per-dimension factors (the short ones: transformers switches to
    # `long_factor` only past original_max_position_embeddings, which compile refuses), cos and sin times
    # `attention_factor`
    short_factor: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "short_factor", tuple(float(x) for x in self.short_factor))  # a manifest's list

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "RopeConfig":
        """From a config's `rope_parameters`, or the older top-level `rope_theta` + `rope_scaling`. `dynamic` (NTK)
        scaling changes nothing within `max_position_embeddings` (transformers rescales only beyond it): it is
        read as the default rope, and compile bounds --max-seq-len by `max_position_embeddings`."""
        params = raw.get("rope_parameters")
        if params is None:  # older form: rope_theta + rope_scaling at the top level
            params = dict(raw.get("rope_scaling") or {})
            params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(
                f"unsupported rope scaling type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        original = 8192
        if rope_type in USES_ORIGINAL_LENGTH:  # transformers: a top-level value (Phi-3's layout) wins
            original = raw.get("original_max_position_embeddings") or params.get(
                "original_max_position_embeddings") or raw.get("max_position_embeddings") or original
        factor = params.get("factor")
        if factor is None and rope_type in ("yarn", "longrope") and raw.get("max_position_embeddings"):
            factor = raw["max_position_embeddings"] / original
        factor = float(1.0 if factor is None else factor)
        theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        scaled = rope_type in ("linear", "llama3", "yarn", "longrope")  # the types that read `factor`
        for name, value in (("rope_theta", theta), *((("the rope scaling factor", factor),) if scaled else ())):
            if not (math.isfinite(value) and value > 0):  # 0 or less: NaN logits after a whole export
                raise CheckpointError(f"config.json: {name} must be a positive number, got {value!r}")
        attention_factor = (_yarn_attention_factor(params, factor) if rope_type == "yarn" else
                            _longrope_attention_factor(params, factor, original) if rope_type == "longrope" else 1.0)
        return cls(
            theta=theta,
            rope_type=rope_type,
            factor=factor,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(original),
            attention_factor=attention_factor,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=flag(params, "truncate", True),
            short_factor=tuple(params["short_factor"]) if rope_type == "longrope" else (),
        )


def _longrope_attention_factor(params: dict[str, Any], factor: float, original: int) -> float:
    """`attention_factor` as given, else sqrt(1 + ln(factor) / ln(original length)) (1 for factor <= 1), as
    transformers computes it for longrope."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _yarn_attention_factor(params: dict[str, Any], factor: float) -> float:
    """`attention_factor` as given, else from `mscale` / `mscale_all_dim` when both are set, else from `factor`."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    architecture: str
    family: str  # "llama" | "qwen" | "gpt2" | "gemma3": which module file builds it
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str = "silu"
    attention_bias: bool = False  # bias on q/k/v (Qwen2: True)
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3
    sliding_window: int | None = None
    rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Gemma 3: per-layer attention kind ("sliding_attention" | "full_attention"; empty = all full). A model
    # with layer_types applies `sliding_window` in the graph (attention mask), so it bounds no context length.
    layer_types: tuple[str, ...] = ()
    local_rope: RopeConfig | None = None  # rope of the sliding layers (None: `rope` everywhere)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (None: head_dim ** -0.5)
    attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap)
    # GPT-2: scores scaled by head_dim ** -0.5 (`scale_attn_weights`, False: unscaled), further divided by
    # layer index + 1 (`scale_attn_by_inverse_layer_idx`)
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    # Phi-3 family (Phi-4 mini: 0.75): the rope turns only each head's first `rotary_dim` dimensions
    partial_rotary_factor: float = 1.0
    # SmolLM3: the layers (indices) whose attention has no rope at all ("NoPE": every 4th in SmolLM3-3B)
    nope_layers: tuple[int, ...] = ()
    # Granite: embeddings x embedding_multiplier, each block's attention and MLP outputs x residual_multiplier before
    # their residual add, attention scale attention_multiplier (None: head_dim ** -0.5), logits / logits_scaling
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0

    def __post_init__(self) -> None:
        # a manifest gives lists and dicts back: restore tuples and RopeConfigs (the dataclass is frozen)
        for name in ("rope", "local_rope"):
            if isinstance(getattr(self, name), dict):
                object.__setattr__(self, name, RopeConfig(**getattr(self, name)))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_layers for i in self.nope_layers):
            raise CheckpointError(f"config: layers without rope must be layer indices, got {list(self.nope_layers)}")
        factor = self.partial_rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise CheckpointError(f"config.json: partial_rotary_factor must be in (0, 1], got {factor!r}")
        if isinstance(self.head_dim, int) and (self.rotary_dim < 2 or self.rotary_dim % 2):
            raise CheckpointError(f"config.json: partial_rotary_factor {factor} turns {self.rotary_dim} of head_dim "
                                  f"{self.head_dim}: the rope needs an even number, at least 2")
        for rope in (self.rope, self.local_rope):
            if rope is not None and rope.rope_type == "longrope" and len(rope.short_factor) != self.rotary_dim // 2:
                what = f"head_dim {self.head_dim}" + ("" if factor == 1 else f" x partial_rotary_factor {factor}")
                raise CheckpointError(f"config.json: longrope short_factor has {len(rope.short_factor)} values, "
                                      f"{what} needs {self.rotary_dim // 2}")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise CheckpointError(f"config.json: unsupported layer_types {bad}; supported: {', '.join(LAYER_TYPES)}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise CheckpointError(
                f"config.json: layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
            )
        if "sliding_attention" in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
            raise CheckpointError(f"config.json: sliding layers need sliding_window > 0, got {self.sliding_window}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):  # NaN, strings, 1e3 from a hostile file
                raise CheckpointError(f"config.json: {name} must be an integer, got {value!r}")
            if value <= 0 and name not in ("intermediate_size", "max_position_embeddings"):  # those: entries.py
                raise CheckpointError(f"config.json: {name} must be positive, got {value}")
        eps = self.norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:  # also NaN
            raise CheckpointError(f"config.json: the norm epsilon must be a number in (0, 1), got {eps!r}")
        bad_ids = [i for i in (*self.eos_token_ids, *(() if self.bos_token_id is None else (self.bos_token_id,)))
                   if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.vocab_size]
        if bad_ids:
            raise CheckpointError(f"config: token id {bad_ids[0]!r} (EOS/BOS) is outside the {self.vocab_size}-token "
                                  "vocabulary")
        if self.sliding_window is not None and (isinstance(self.sliding_window, bool)
                                                or not isinstance(self.sliding_window, int)):
            raise CheckpointError(f"config.json: sliding_window must be an integer, got {self.sliding_window!r}")
        if self.sliding_window is not None and self.sliding_window < 0:
            raise CheckpointError(f"config.json: sliding_window must not be negative, got {self.sliding_window}")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"config.json: num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head the rope turns (the first ones), as transformers: int(head_dim x factor)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def windowed(self) -> bool:
        """True when the graph itself applies `sliding_window` (per layer, through the attention mask)."""
        return "sliding_attention" in self.layer_types

    def layer_window(self, i: int) -> int | None:
        """Sliding window of layer i, or None for full attention."""
        return self.sliding_window if self.layer_types and self.layer_types[i] == "sliding_attention" else None

    def to_dict(self) -> dict[str, Any]:
        """The manifest's `decoder_config`; fields added after format version 1 shipped are written only where they
        differ from their defaults, so a manifest written before them reads back and writes out key for key."""
        out = _without_later_defaults(dataclasses.asdict(self), LATER_DECODER_DEFAULTS)
        for name in ("rope", "local_rope"):
            if out[name] is not None:
                out[name] = _without_later_defaults(out[name], LATER_ROPE_DEFAULTS)
        return out


LATER_DECODER_DEFAULTS = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                          "partial_rotary_factor": 1.0, "nope_layers": (), "embedding_multiplier": 1.0,
                          "residual_multiplier": 1.0, "attention_multiplier": None, "logits_scaling": 1.0}
LATER_ROPE_DEFAULTS = {"attention_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True,
                       "short_factor": ()}


def _without_later_defaults(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in defaults or v != defaults[k]}


def decoder_config(entry: dict[str, Any]) -> DecoderConfig:
    """The DecoderConfig recorded in a bundle manifest's model entry (`decoder_config`)."""
    raw = dict(entry["decoder_config"])
    raw["rope"] = RopeConfig(**raw["rope"])
    raw["eos_token_ids"] = tuple(raw.get("eos_token_ids") or ())
    return DecoderConfig(**raw)


def lm_head_share(c) -> dict[str, Any]:
    """What the LM head weighs in one decode step: its weights (vocab x hidden, tied or not: the step reads the
    whole matrix) against every layer's projection weights (the embedding Gather reads one row, left out).
    Weights read per step is what a one-token step costs on a CPU; the head's share is what logits computed
    for fewer rows save in prefill, and what a large vocabulary (Gemma 3: 262,144) costs in every step."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    mlp_mats = 2 if c.family == "gpt2" else 3  # fc + proj, else gate + up + down
    per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + mlp_mats * c.hidden_size * c.intermediate_size
    layers = c.num_layers * per_layer
    head = c.vocab_size * c.hidden_size
    return {"head_weights": head, "layer_weights": layers, "share": round(head / (head + layers), 4)}
