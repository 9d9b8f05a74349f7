"""ONNX graph -> serialized TensorRT engine, as small loaders named by input and output (like Polygraphy):

    network_from_onnx(trt, onnx_path, logger)           -> (builder, network, parser)
    config_for_profiles(trt, builder, network, profiles, options, logger) -> IBuilderConfig
    engine_from_network(builder, network, config)       -> bytes (the plan)
    save_engine(plan, path)  /  save_timing_cache(config, path)

`build_engine(...)` chains them for one model; `engine_entry(...)` is the manifest record. TensorRT
is passed in (never imported at module level), so everything but the native calls is CPU-testable.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

from specrt.bundle.parts import EngineEntry
from specrt.core.errors import BackendError, InvalidArgument
from specrt.core.trt import make_logger
from specrt.compiler.trt.options import HW_COMPAT, BuildOptions
from specrt.compiler.trt.precision import half_onnx_from_fp32
from specrt.compiler.trt.ptq import PTQ_PRECISIONS

PHASE_ORDER = ("prefill", "decode", "verify")  # optimization profile index = position here


def polygraphy_profiles(profiles: dict[str, Any], order: tuple[str, ...] = PHASE_ORDER) -> list[tuple[str, Any]]:
    """Manifest profiles {phase: {input: {min, opt, max}}} -> [(phase, polygraphy Profile)] in `order` (a
    decoder's PHASE_ORDER; the draft head's profiles.HEAD_PHASES)."""
    from polygraphy.backend.trt import Profile

    out = []
    for phase in order:
        if phase not in profiles:
            raise InvalidArgument(f"profiles lack the {phase!r} phase (have {sorted(profiles)})")
        p = Profile()
        for name, s in profiles[phase].items():
            p.add(name, tuple(s["min"]), tuple(s["opt"]), tuple(s["max"]))
        out.append((phase, p))
    return out


def network_from_onnx(trt, onnx_path: Path, logger) -> tuple[Any, Any, Any]:
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # TensorRT 10; always on in 11
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    if network is None:
        raise BackendError("TensorRT create_network returned None")
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # parse_from_file finds the external .data file
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendError(f"TensorRT's ONNX parser rejected {onnx_path.name}: {errors or 'no details'} "
                           "(see `specrt inspect BUNDLE` for the operator check)")
    return builder, network, parser


def config_for_profiles(trt, builder, network, profiles: dict[str, Any], options: BuildOptions,
                        order: tuple[str, ...] = PHASE_ORDER):
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace)
    if options.precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # on by default; fp32 engines keep fp32 matmuls (parity 1e-4)
    if options.builder_optimization_level is not None:
        config.builder_optimization_level = options.builder_optimization_level
    if options.hardware_compat != "none":
        name = HW_COMPAT[options.hardware_compat]
        if not hasattr(trt.HardwareCompatibilityLevel, name):
            raise BackendError(f"this TensorRT ({trt.__version__}) has no HardwareCompatibilityLevel.{name}")
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, name)
    if options.version_compatible:  # the lean runtime is embedded in the plan (no EXCLUDE_LEAN_RUNTIME)
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    blob = options.timing_cache.read_bytes() if options.timing_cache and options.timing_cache.exists() else b""
    cache = config.create_timing_cache(blob)
    if blob and (cache is None or not config.set_timing_cache(cache, ignore_mismatch=False)):
        warnings.warn(f"timing cache {options.timing_cache} is from another GPU / TensorRT; starting a new one")
        blob, cache = b"", config.create_timing_cache(b"")
    if not blob and (cache is None or not config.set_timing_cache(cache, ignore_mismatch=False)):
        raise BackendError("TensorRT create_timing_cache / set_timing_cache failed on an empty cache")
    for phase, profile in polygraphy_profiles(profiles, order):
        index = config.add_optimization_profile(profile.to_trt(builder, network))
        if index != order.index(phase):
            raise BackendError(f"TensorRT add_optimization_profile({phase}) returned {index}, "
                               f"expected {order.index(phase)} (invalid min/opt/max shapes?)")
    return config


def engine_from_network(builder, network, config, log_lines: list[str] | None = None) -> bytes:
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendError("TensorRT build_serialized_network returned None: "
                           + (" | ".join((log_lines or [])[-5:]) or "see the TensorRT log"))
    return bytes(plan)


def save_engine(plan: bytes, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(plan)
    return path


def save_timing_cache(config, path: Path | None) -> None:
    if path is None:
        return
    cache = config.get_timing_cache()
    if cache is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(bytes(cache.serialize()))
        tmp.replace(path)


def engine_entry(role: str, rel_path: str, options: BuildOptions, facts: dict[str, Any],
                 quantization: dict[str, Any] | None = None, order: tuple[str, ...] = PHASE_ORDER) -> EngineEntry:
    """The manifest record `engines.<role>` (file checksums live in the manifest's `files`); `quantization`:
    what compiler/trt/ptq.py recorded for an int8 / fp8 / int4 engine."""
    return EngineEntry(
        role=role,
        path=rel_path,
        tensorrt_version=facts["tensorrt_version"],
        cuda_version=facts["cuda_version"],
        gpu_name=facts["gpu_name"],
        compute_capability=facts["compute_capability"],
        hardware_compatibility_level=options.hardware_compat,
        version_compatible=options.version_compatible,
        lean_runtime_embedded=options.version_compatible,
        precision=options.precision,
        workspace_bytes=options.workspace,
        builder_optimization_level=options.builder_optimization_level,
        profiles=order,
        quantization=quantization,
    )


def half_precision(precision: str) -> str | None:
    """The float type of the graph TensorRT builds: None (fp32 as exported), fp16 / bf16, and fp16 around the
    Q/DQ nodes of int8 / fp8 / int4 graphs."""
    return None if precision == "fp32" else "fp16" if precision in PTQ_PRECISIONS else precision


def trt_input_graph(onnx_path: Path, scratch: Path, max_batch: int = 1) -> Path:
    """The graph TensorRT parses: `past_lengths` as a real input (TensorRT takes an input with a default as a
    constant; compiler/input_defaults.py), so the engine runs several sequences of different lengths per pass.
    A batched build (max_batch > 1) needs a graph that reads it (InvalidArgument otherwise)."""
    import onnx

    from specrt.bundle.graph_io import PAST_LENGTHS
    from specrt.compiler.input_defaults import graph_without_default

    src = graph_without_default(onnx_path, scratch)
    if max_batch > 1:
        model = onnx.load(str(src), load_external_data=False)
        if not any(PAST_LENGTHS in node.input for node in model.graph.node):
            raise InvalidArgument(f"--max-batch {max_batch}: {Path(onnx_path).name} does not read {PAST_LENGTHS} "
                                  "(a graph from before batched passes, or a quantizer folded it away): batched "
                                  "engines need the batched portable graph; use --max-batch 1")
    return src


def build_engine(trt, onnx_path: Path, engine_path: Path, profiles: dict[str, Any], options: BuildOptions,
                 order: tuple[str, ...] = PHASE_ORDER) -> None:
    """fp32 ONNX graph (a Q/DQ graph for int8 / fp8 / int4) -> (half ONNX graph) -> engine file at
    `engine_path`; updates the timing cache."""
    lines: list[str] = []
    logger = make_logger(trt, lines)
    with tempfile.TemporaryDirectory(prefix="specrt-half-") as tmp:
        src = onnx_path
        half = half_precision(options.precision)
        if half is not None:
            src = half_onnx_from_fp32(onnx_path, Path(tmp) / f"model.{options.precision}.onnx", half)
        src = trt_input_graph(src, Path(tmp) / "model.trt-input.onnx", options.max_batch)
        builder, network, _parser = network_from_onnx(trt, src, logger)
        config = config_for_profiles(trt, builder, network, profiles, options, order)
        plan = engine_from_network(builder, network, config, lines)
    save_engine(plan, engine_path)
    save_timing_cache(config, options.timing_cache)

