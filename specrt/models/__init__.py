"""Decoder definitions, one small file per architecture family, and the architecture registry."""

from __future__ import annotations

from typing import Any, Callable

from specrt.core.errors import CheckpointError
from specrt.models import gemma3, gpt2, llama, qwen
from specrt.models.base import Decoder, DecoderOutput, empty_past
from specrt.models.config import DecoderConfig

# architecture name in config.json -> (config parser, module class)
ARCHITECTURES: dict[str, tuple[Callable[[dict[str, Any], str], DecoderConfig], type[Decoder]]] = {
    "LlamaForCausalLM": (llama.parse_config, llama.LlamaDecoder),
    "MistralForCausalLM": (llama.parse_config, llama.LlamaDecoder),
    "Qwen2ForCausalLM": (qwen.parse_config, qwen.QwenDecoder),
    "Qwen3ForCausalLM": (qwen.parse_config, qwen.QwenDecoder),
    "GPT2LMHeadModel": (gpt2.parse_config, gpt2.GPT2Decoder),
    "Gemma3ForCausalLM": (gemma3.parse_config, gemma3.Gemma3Decoder),
}


def resolve_architecture(raw: dict[str, Any]) -> str:
    names = raw.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return name
    shown = ", ".join(names) if names else f"model_type={raw.get('model_type')!r}"
    raise CheckpointError(
        f"unsupported architecture {shown}; supported: {', '.join(ARCHITECTURES)}"
    )


def parse_config(raw: dict[str, Any]) -> DecoderConfig:
    arch = resolve_architecture(raw)
    parser, _ = ARCHITECTURES[arch]
    try:
        return parser(raw, arch)
    except KeyError as exc:
        raise CheckpointError(f"config.json for {arch} lacks the field {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as exc:  # NaN, strings, 0 where sizes belong
        raise CheckpointError(f"config.json for {arch} holds a value of the wrong type or range: {exc}") from None


def build_decoder(config: DecoderConfig) -> Decoder:
    _, cls = ARCHITECTURES[config.architecture]
    return cls(config)


__all__ = ["ARCHITECTURES", "Decoder", "DecoderConfig", "DecoderOutput", "build_decoder", "empty_past",
           "parse_config", "resolve_architecture"]
