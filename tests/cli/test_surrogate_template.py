"""A bundle whose chat template renders a lone surrogate: `specrt generate --chat` says so in one line, exit 2
(it was a TypeError traceback from `tokenizers`)."""

import json
import shutil

import pytest
from click.testing import CliRunner

from specrt.cli.main import main


@pytest.mark.slow  # a compile (~40 s on 2 loaded cores)
def test_generate_chat_with_a_template_rendering_a_lone_surrogate(tmp_path, llama_target):
    from specrt.compiler import CompileSpec, compile_bundle

    ckpt = shutil.copytree(llama_target, tmp_path / "ckpt")
    template = "{% for m in messages %}{{ m.content }}{% endfor %}\ud800"
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))  # "\ud800" in the JSON
    bundle = compile_bundle(CompileSpec(ckpt, tmp_path / "b", max_seq_len=64, max_draft_tokens=2))
    res = CliRunner().invoke(main, ["generate", str(bundle), "--chat", "hi", "--max-new-tokens", "2"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("error: the model's chat template rendered a lone surrogate (U+D800"), res.output
