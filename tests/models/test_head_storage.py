"""A draft head stored as int8 (specrt/models/head_storage.py, #52): the round trip's error bound, both storages read
back by the loaders, and files that do not match their head_config.json refused with one clear line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import fp32_decoder as _decoder, random_fused_head

LAYERS = (0, 1)


@pytest.fixture(scope="module")
def fused_head(llama_target):
    """A tiny random fused head on the session's 2-layer Llama (tests/helpers.random_fused_head)."""
    return random_fused_head(_decoder(llama_target), LAYERS)


@pytest.fixture(scope="module")
def head_dirs(fused_head, tmp_path_factory):
    """{storage: the fused head saved in it}."""
    from specrt.models.draft_head_fused import save_fused_head

    base = tmp_path_factory.mktemp("head_storage")
    for dtype in (torch.float32, torch.float16, torch.int8):
        save_fused_head(fused_head, base / str(dtype)[6:], dtype=dtype)
    return {name: base / name for name in ("float32", "float16", "int8")}


def test_int8_round_trip_is_within_half_a_step_per_row():
    """|dequantized - original| <= scale / 2 on every weight (scale = max|row| / 127), a zero row stays zero, and the
    error is ~1/254 of the row's largest weight: far below the fp16-vs-fp32 differences the head already tolerates
    for its largest weights."""
    from specrt.models.head_storage import dequantize_int8, quantize_int8

    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 200, generator=g) * torch.logspace(-3, 1, 96)[:, None]  # rows of very different sizes
    w[5] = 0.0
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (96,)
    err = (dequantize_int8(q, scale) - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-6 * scale[:, None]).all())
    assert bool((err.amax(dim=1) <= w.abs().amax(dim=1) / 254 + 1e-12).all())
    assert int(q.abs().max()) == 127 and float(err[5].max()) == 0.0


def test_saved_int8_head_is_smaller_and_loads_back_within_the_bound(fused_head, head_dirs, llama_target):
    """save_fused_head(dtype=int8): matrices int8 + float32 row scales, biases / norms fp16, `storage: int8` in
    head_config.json; load_fused_head returns fp32 parameters within half a quantization step of the trained ones."""
    from safetensors import safe_open

    from specrt.models.draft_head_fused import load_fused_head
    from specrt.models.head_storage import SCALE

    cfg = json.loads((head_dirs["int8"] / "head_config.json").read_text())
    assert cfg["storage"] == "int8" and cfg["version"] == 2
    with safe_open(str(head_dirs["int8"] / "head.safetensors"), "pt") as f:
        kinds = {k: f.get_tensor(k).dtype for k in f.keys()}
    own = fused_head.trained_state()
    assert {k for k in kinds if not k.endswith(SCALE)} == set(own)
    for name, value in own.items():
        assert kinds[name] == (torch.int8 if value.dim() == 2 else torch.float16), name
    sizes = {s: (d / "head.safetensors").stat().st_size for s, d in head_dirs.items()}
    assert sizes["int8"] < 0.55 * sizes["float16"] < 0.3 * sizes["float32"]
    back = load_fused_head(head_dirs["int8"], _decoder(llama_target)).trained_state()
    for name, value in own.items():
        bound = value.abs().amax(dim=-1, keepdim=True) / 254 if value.dim() == 2 else value.abs() / 1024
        assert back[name].dtype == torch.float32
        assert bool(((back[name] - value).abs() <= bound + 1e-7).all()), name


def test_plain_head_int8_loads_through_load_head(tmp_path, llama_target):
    """The plain (version 1) head's loader reads int8 too (compile's `load_head`)."""
    from specrt.models.draft_head import DraftHead, load_head, save_head

    dec = _decoder(llama_target)
    head = DraftHead(dec, torch.arange(40))
    save_head(head, tmp_path / "h", dtype=torch.int8)
    back, cfg = load_head(tmp_path / "h", dec)
    assert cfg["storage"] == "int8"
    w, got = head.fc.weight.detach(), back.fc.weight.detach()
    assert float((got - w).abs().max()) <= float(w.abs().max()) / 254 + 1e-7


def test_convert_rewrites_a_head_directory(head_dirs, tmp_path, llama_target):
    """An fp16 head directory rewritten as int8 without its target (how the shipped head was made): the same
    parameters as saving int8 from the module up to fp16 rounding, metrics and config saying int8."""
    from specrt.models.draft_head_fused import load_fused_head
    from specrt.models.head_storage import convert_head_dir

    src = tmp_path / "src"
    shutil.copytree(head_dirs["float16"], src)
    (src / "metrics.json").write_text(json.dumps({"weights_dtype": "float16"}))
    errors = convert_head_dir(src, tmp_path / "out", "int8")
    assert set(errors) and all(e < 0.02 for e in errors.values())
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["weights_dtype"] == "int8"
    dec = _decoder(llama_target)
    a = load_fused_head(tmp_path / "out", dec).trained_state()
    b = load_fused_head(head_dirs["int8"], dec).trained_state()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 0.02


def test_export_converts_the_shipped_form_with_its_card(head_dirs, tmp_path):
    """recipes/head_export.convert_fused_head: an fp16 head directory rewritten as int8 in place, metrics and config
    saying so, the card naming the storage, holding the storage notes and the curve up to the exported step."""
    from specrt.recipes.head_export import convert_fused_head

    out = tmp_path / "shipped"
    shutil.copytree(head_dirs["float16"], out)
    metrics = {"recipe": "fused", "feature_layers": list(LAYERS), "draft_vocab_size": 320, "ttt_depth": 3, "steps": 4,
               "train_tokens": 100, "weights_dtype": "float16",
               "heldout_acceptance": {"per_position": [0.5, 0.2, 0.1], "conditional": [0.5, 0.4, 0.5]}}
    (out / "metrics.json").write_text(json.dumps(metrics))
    curve = [{"step": s, "tokens_seen": 10 * s, "train_tokens": 100, "heldout_per_position": [0.5, 0.2, 0.1]}
             for s in (2, 4, 6)]
    m = convert_fused_head(out, out, curve, dtype=torch.int8, about={"storage_notes": "int8 measured the same"})
    assert m["weights_dtype"] == "int8" and max(m["max_abs_error"].values()) < 0.02
    cfg = json.loads((out / "head_config.json").read_text())
    assert cfg["storage"] == "int8" and cfg["training"]["storage_notes"] == "int8 measured the same"
    card = (out / "README.md").read_text()
    assert "int8 weight matrices" in card and "## Storage\n\nint8 measured the same" in card
    assert "| 4 |" in card and "| 6 |" not in card
    with pytest.raises(ValueError, match="not torch.bfloat16"):
        convert_fused_head(out, out, curve, dtype=torch.bfloat16)


def _swap(src, dst, tmp_path, storage=None, edit=None):
    """A copy of head dir `dst` whose head.safetensors is `src`'s (or edited by `edit`), config storage `storage`."""
    out = tmp_path / "bad"
    shutil.copytree(dst, out)
    shutil.copy2(src / "head.safetensors", out / "head.safetensors")
    if edit:
        edit(out / "head.safetensors")
    cfg = json.loads((out / "head_config.json").read_text())
    if storage is not None:
        cfg["storage"] = storage
    (out / "head_config.json").write_text(json.dumps(cfg))
    return out


def _drop_scale(path):
    from safetensors.torch import load_file, save_file

    t = load_file(str(path))
    save_file({k: v for k, v in t.items() if k != "fc.weight_scale"}, str(path))


def _short_scale(path):
    from safetensors.torch import load_file, save_file

    t = load_file(str(path))
    save_file({**t, "fc.weight_scale": t["fc.weight_scale"][:-1].contiguous()}, str(path))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize("case, says", [
    ("int4", "storage must be one of float32, float16, int8"),
    ("fp16 file, int8 config", "holds fc.weight as F16 [64, 256] but its head_config.json says storage int8"),
    ("int8 file, fp16 config", "holds fc.weight as I8 [64, 256] but its head_config.json says storage float16"),
    ("int8 file, no storage key", "says storage float (no storage key)"),
    ("missing scale", "holds fc.weight as I8 [64, 256] but its head_config.json says storage int8"),
    ("short scale", "fc.weight_scale F32 [63], not the float scales [rows] of an int8 matrix fc.weight"),
    ("truncated", "is not a readable safetensors file"),
])
def test_bad_storage_is_refused_with_one_line(head_dirs, tmp_path, case, says):
    """read_head_config (what `specrt compile --draft head:DIR` runs first) and the loaders refuse a file that is not
    what its config says, naming the tensor, before anything is exported."""
    from specrt.core.errors import CheckpointError
    from specrt.models.draft_head import read_head_config

    i8, f16 = head_dirs["int8"], head_dirs["float16"]
    bad = {"int4": lambda: _swap(i8, i8, tmp_path, "int4"),
           "fp16 file, int8 config": lambda: _swap(f16, i8, tmp_path),
           "int8 file, fp16 config": lambda: _swap(i8, f16, tmp_path),
           "int8 file, no storage key": lambda: _no_key(_swap(i8, i8, tmp_path)),
           "missing scale": lambda: _swap(i8, i8, tmp_path, edit=_drop_scale),
           "short scale": lambda: _swap(i8, i8, tmp_path, edit=_short_scale),
           "truncated": lambda: _swap(i8, i8, tmp_path, edit=_truncate)}[case]()
    with pytest.raises(CheckpointError) as info:
        read_head_config(bad)
    assert says in str(info.value) and "\n" not in str(info.value)


def _no_key(path):
    cfg = json.loads((path / "head_config.json").read_text())
    del cfg["storage"]
    (path / "head_config.json").write_text(json.dumps(cfg))
    return path


def _nan_scale(path):
    from safetensors.torch import load_file, save_file

    t = load_file(str(path))
    t["fc.weight_scale"][3] = float("nan")
    save_file(t, str(path))


def test_corrupt_scales_are_refused_by_the_loader(head_dirs, tmp_path, llama_target):
    """A NaN scale passes the header check but not the load (compile's `load_head`): one line naming the tensor."""
    from specrt.core.errors import CheckpointError
    from specrt.models.draft_head import load_head

    bad = _swap(head_dirs["int8"], head_dirs["int8"], tmp_path, edit=_nan_scale)
    with pytest.raises(CheckpointError, match="fc.weight_scale holds negative or non-finite scales"):
        load_head(bad, _decoder(llama_target))


def test_cli_compile_refuses_a_mismatched_head_in_one_line(head_dirs, tmp_path, llama_target):
    """`specrt compile --draft head:DIR` with an fp16 file under `storage: int8`: exit 2, one line, no traceback,
    nothing written."""
    from click.testing import CliRunner

    from specrt.cli.main import main

    bad = _swap(head_dirs["float16"], head_dirs["int8"], tmp_path)
    res = CliRunner().invoke(main, ["compile", "--target", str(llama_target), "--draft", f"head:{bad}",
                                    "-o", str(tmp_path / "bundle"), "--max-seq-len", "64"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "says storage int8" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "bundle").exists()
