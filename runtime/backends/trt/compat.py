"""Is an engine in the bundle loadable here? Compare its manifest facts with what is installed.

Pure Python: `check_engine_entry(role, entry, installed)` takes the manifest's `EngineEntry` (complete: the
manifest refuses an entry that lacks a fact) and the installed facts as a dict, so every mismatch is
unit-tested without TensorRT. Rules (TensorRT "Engine Compatibility" docs):

- TensorRT version: a plain engine runs only on the version that built it (major.minor.patch);
  a version-compatible engine (--version-compatible, lean runtime embedded) runs on that version or
  a later one.
- GPU: hardware-compatibility level "none" and "same_compute_capability" need the same compute
  capability; "ampere_plus" needs compute capability 8.0 or newer.
- CUDA: the engine's CUDA major version must match the installed one (TensorRT builds are per CUDA major).
- Checksums and sizes of the engine files are verified by read_manifest before any of this.
"""

from __future__ import annotations

from typing import Any, Mapping

from specrt.bundle.parts import EngineEntry
from specrt.core.errors import BackendError, BundleError, VersionMismatch

HW_LEVELS = ("none", "ampere_plus", "same_compute_capability")
REBUILD = "rebuild the engines on this machine: specrt compile --target ... -o BUNDLE --engines trt --force"


def parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for p in str(text).split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def parse_cc(text: str | tuple) -> tuple[int, int]:
    """'8.9' / (8, 9) / 'sm_89' -> (8, 9)."""
    if isinstance(text, (tuple, list)):
        return int(text[0]), int(text[1])
    s = str(text).lower().removeprefix("sm_").removeprefix("sm")
    if "." in s:
        major, minor = s.split(".", 1)
    else:
        major, minor = s[:-1], s[-1:]
    try:
        return int(major), int(minor)
    except ValueError:
        raise BundleError(f"compute capability {text!r} is not of the form MAJOR.MINOR") from None


def check_engine_entry(role: str, entry: EngineEntry, installed: Mapping[str, Any]) -> None:
    """Raise VersionMismatch (both values + the rebuild command) or BundleError (malformed entry)."""
    level = entry.hardware_compatibility_level
    if level not in HW_LEVELS:
        raise BundleError(f"engine {role}: unknown hardware_compatibility_level {level!r} (one of {HW_LEVELS})")
    built, have = parse_version(entry.tensorrt_version), parse_version(installed["tensorrt_version"])
    if entry.version_compatible:
        if have[:3] < built[:3]:
            raise VersionMismatch(
                f"engine {role} was built with TensorRT {entry.tensorrt_version} (version-compatible), but the "
                f"installed TensorRT {installed['tensorrt_version']} is older: upgrade TensorRT or {REBUILD}")
    elif built[:3] != have[:3]:
        raise VersionMismatch(
            f"engine {role} was built with TensorRT {entry.tensorrt_version}, this machine has TensorRT "
            f"{installed['tensorrt_version']}: {REBUILD} (or build with --version-compatible)")
    cc_built, cc_have = parse_cc(entry.compute_capability), parse_cc(installed["compute_capability"])
    fmt = lambda cc: f"{cc[0]}.{cc[1]}"  # noqa: E731
    if level == "ampere_plus":
        if cc_have < (8, 0):
            raise VersionMismatch(
                f"engine {role} is hardware-compatible with Ampere and newer (compute >= 8.0), this GPU "
                f"({installed.get('gpu_name', '?')}) is compute {fmt(cc_have)}: {REBUILD}")
    elif cc_built != cc_have:
        raise VersionMismatch(
            f"engine {role} was built for compute {fmt(cc_built)} ({entry.gpu_name}), this GPU "
            f"({installed.get('gpu_name', '?')}) is compute {fmt(cc_have)}: {REBUILD} "
            "(or build with --hardware-compat ampere-plus)")
    cu_built, cu_have = parse_version(entry.cuda_version or ""), parse_version(installed.get("cuda_version") or "")
    if cu_built and cu_have and cu_built[0] != cu_have[0]:
        raise VersionMismatch(
            f"engine {role} was built with CUDA {entry.cuda_version}, this machine runs CUDA "
            f"{installed['cuda_version']}: install the TensorRT build for CUDA {cu_built[0]} or {REBUILD}")




def engine_from_bytes(runtime: Any, blob: bytes, role: str, log_lines: list[str] | None = None) -> Any:
    """runtime.deserialize_cuda_engine(blob), with a None (TensorRT's failure signal) turned into a typed error."""
    if not blob:
        raise BundleError(f"engine file for {role} is empty; {REBUILD}")
    try:
        engine = runtime.deserialize_cuda_engine(blob)
    except Exception as exc:  # some TensorRT builds raise instead of returning None
        engine, log_lines = None, list(log_lines or []) + [f"{type(exc).__name__}: {exc}"]
    if engine is None:
        log = " | ".join(log_lines or []) or "no TensorRT log"
        kind = VersionMismatch if any(w in log.lower() for w in ("version", "compute", "platform")) else BundleError
        raise kind(f"TensorRT could not deserialize the {role} engine ({len(blob)} bytes; TensorRT says: {log}): "
                   f"the file is corrupted or was built for another TensorRT / GPU; {REBUILD}")
    return engine


def check_call(ok: Any, call: str, detail: str) -> None:
    """TensorRT signals failure by returning False: raise BackendError naming the call and the shapes."""
    if ok is False or ok is None:
        raise BackendError(f"TensorRT {call} failed ({detail})")
