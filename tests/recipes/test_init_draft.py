"""A draft initialised from the target's own layers: the chosen layers, embedding, final norm and head are the
target's tensors; the draft compiles and runs as a draft with greedy output identical to plain decoding."""

import json

import pytest
import torch
from safetensors.torch import load_file

from specrt.recipes.init_draft import draft_from_target, parse_layers, pick_layers


def test_pick_layers_evenly_spaced_and_checked():
    assert pick_layers(30, num_layers=4) == (0, 10, 19, 29)
    assert pick_layers(30, num_layers=1) == (0,)
    assert pick_layers(4, num_layers=4) == (0, 1, 2, 3)
    assert pick_layers(30, layers=parse_layers("0,10,20,29")) == (0, 10, 20, 29)
    for kwargs, match in (({"num_layers": 31}, r"\[1, 30\]"), ({"layers": (0, 30)}, "layer 30 is outside"),
                          ({"layers": (5, 2)}, "strictly increasing"), ({}, "exactly one")):
        with pytest.raises(ValueError, match=match):
            pick_layers(30, **kwargs)
    with pytest.raises(ValueError, match="comma-separated"):
        parse_layers("0;3")


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory, tokenizer_path):
    from helpers import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("init") / "target", "llama", tokenizer_path, layers=5, seed=3)


def _same(a, b):
    return a.shape == b.shape and torch.equal(a, b)


def test_draft_holds_the_chosen_target_layers(deep_target):
    import transformers as tf

    target = tf.AutoModelForCausalLM.from_pretrained(deep_target, dtype=torch.float32)
    draft = draft_from_target(target, (0, 2, 4))
    assert type(draft) is type(target) and draft.config.num_hidden_layers == 3
    t, d = target.state_dict(), draft.state_dict()
    for j, i in enumerate((0, 2, 4)):
        for name in [n for n in t if n.startswith(f"model.layers.{i}.")]:
            assert _same(d[name.replace(f"layers.{i}.", f"layers.{j}.")], t[name]), name
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert _same(d[name], t[name]), name
    assert not any(n.startswith("model.layers.3.") for n in d)


def specrt(*args):
    """In-process (tests/helpers.py run_cli): what a `python -m specrt` process would print and exit with."""
    from helpers import run_cli

    return run_cli(*args)


@pytest.mark.slow  # distill + compile + decode
def test_cli_init_from_target_compiles_and_drafts(tmp_path, deep_target):
    """--steps 0: the saved draft is exactly the initialisation (layers 1 and 3 of the target)."""
    data = tmp_path / "text"
    data.mkdir()
    import textwrap

    (data / "a.py").write_text(open(textwrap.__file__).read())
    out = tmp_path / "draft"
    proc = specrt("distill-draft", "--target", deep_target, "--data", data, "-o", out, "--init-from-target",
                  "--layers", "1,3", "--steps", 0, "--seq-len", 32, "--batch-size", 2, "--json")
    assert proc.returncode == 0, proc.stderr
    d, t = load_file(str(out / "model.safetensors")), load_file(str(deep_target / "model.safetensors"))
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    for j, i in ((0, 1), (1, 3)):
        assert _same(d[f"model.layers.{j}.mlp.up_proj.weight"], t[f"model.layers.{i}.mlp.up_proj.weight"])
    assert _same(d["model.embed_tokens.weight"], t["model.embed_tokens.weight"])
    bundle = tmp_path / "bundle"
    proc = specrt("compile", "--target", deep_target, "--draft", out, "-o", bundle, "--max-seq-len", 96,
                  "--max-draft-tokens", 4)
    assert proc.returncode == 0, proc.stderr
    from specrt.runtime import load

    gen = load(bundle, backend="ort")
    for prompt in ("import os\ndef main(", "class Parser:\n    def"):
        plain = gen.generate(prompt, 32, method="none")
        spec = gen.generate(prompt, 32, method="draft", num_speculative_tokens=3)
        assert spec.token_ids == plain.token_ids and spec.stats.drafted_tokens > 0


@pytest.mark.parametrize("args, match", [(["--layers", "0,9"], "layer 9 is outside"),
                                         (["--num-layers", "9"], "num_layers must be in [1, 5]"),
                                         (["--layers", "1", "--num-layers", "2"], "not both")])
def test_cli_bad_layer_choice(tmp_path, deep_target, args, match):
    from helpers import run_cli

    data = tmp_path / "text"  # beside the output: an output inside --data is refused before anything else
    data.mkdir()
    proc = run_cli("distill-draft", "--target", deep_target, "--data", data, "-o", tmp_path / "o",
                   "--init-from-target", *args)
    assert proc.returncode == 2 and match in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()
