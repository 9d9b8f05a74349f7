"""Decoder definitions, one small file per architecture family, and the architecture registry.

Importing this package imports no torch: `specrt.models.config` (read by the bundle, so by every runtime)
is torch-free, and the torch decoders load on first use of `ARCHITECTURES`, `Decoder`, `DecoderOutput`,
`empty_past`, `parse_config` or `build_decoder` (PEP 562 `__getattr__`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

from specrt.core.errors import CheckpointError
from specrt.models.config import DecoderConfig

if TYPE_CHECKING:
    from specrt.models.base import Decoder, DecoderOutput, empty_past  # noqa: F401

_LAZY = {"Decoder": "specrt.models.base", "DecoderOutput": "specrt.models.base", "empty_past": "specrt.models.base"}


def _architectures() -> dict[str, tuple[Callable[[dict[str, Any], str], DecoderConfig], type]]:
    """architecture name in config.json -> (config parser, module class); imports the torch decoders."""
    from specrt.models import gemma2, gemma3, gpt2, granite, llama, phi3, qwen, smollm3

    return {
        "LlamaForCausalLM": (llama.parse_config, llama.LlamaDecoder),
        "MistralForCausalLM": (llama.parse_config, llama.LlamaDecoder),
        "Qwen2ForCausalLM": (qwen.parse_config, qwen.QwenDecoder),
        "Qwen3ForCausalLM": (qwen.parse_config, qwen.QwenDecoder),
        "GPT2LMHeadModel": (gpt2.parse_config, gpt2.GPT2Decoder),
        "Gemma3ForCausalLM": (gemma3.parse_config, gemma3.Gemma3Decoder),
        "Gemma2ForCausalLM": (gemma2.parse_config, gemma3.Gemma3Decoder),
        "Phi3ForCausalLM": (phi3.parse_config, phi3.Phi3Decoder),
        "SmolLM3ForCausalLM": (smollm3.parse_config, llama.LlamaDecoder),
        "GraniteForCausalLM": (granite.parse_config, llama.LlamaDecoder),
    }


def __getattr__(name: str) -> Any:
    if name == "ARCHITECTURES":
        value = globals()["ARCHITECTURES"] = _architectures()
        return value
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_architecture(raw: dict[str, Any]) -> str:
    names = raw.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"config.json: architectures must be a list of class names (e.g. "
                              f"[\"LlamaForCausalLM\"]), got {names!r}")
    for name in names:
        if name in __getattr__("ARCHITECTURES"):
            return name
    shown = ", ".join(names) if names else f"model_type={raw.get('model_type')!r}"
    raise CheckpointError(
        f"unsupported architecture {shown}; supported: {', '.join(__getattr__('ARCHITECTURES'))}"
    )


def parse_config(raw: dict[str, Any]) -> DecoderConfig:
    arch = resolve_architecture(raw)
    parser, _ = __getattr__("ARCHITECTURES")[arch]
    try:
        return parser(raw, arch)
    except KeyError as exc:
        raise CheckpointError(f"config.json for {arch} lacks the field {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as exc:  # NaN, strings, 0 where sizes belong
        raise CheckpointError(f"config.json for {arch} holds a value of the wrong type or range: {exc}") from None


def build_decoder(config: DecoderConfig) -> "Decoder":
    _, cls = __getattr__("ARCHITECTURES")[config.architecture]
    return cls(config)


__all__ = ["ARCHITECTURES", "Decoder", "DecoderConfig", "DecoderOutput", "build_decoder", "empty_past",
           "parse_config", "resolve_architecture"]
