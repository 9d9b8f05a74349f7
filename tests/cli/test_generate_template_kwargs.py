"""`specrt generate --chat-template-kwargs JSON`: template variables (Qwen3's `enable_thinking`) reach the bundle's
chat template for --chat and --prompts-file's chat lines, as the server's `chat_template_kwargs`; bad values are one
line and exit 2."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrt.cli.main import main

TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
            "{% if enable_thinking is defined and not enable_thinking %} <think></think>{% endif %}")


@pytest.fixture(scope="module")
def templated(tmp_path_factory, pair_bundle) -> Path:
    """The session's pair bundle with a chat template that reads `enable_thinking` (manifest entry and checksum)."""
    bundle = shutil.copytree(pair_bundle, tmp_path_factory.mktemp("tpl") / "bundle")
    rel = "tokenizer/chat_template.jinja"
    (bundle / rel).write_text(TEMPLATE)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["tokenizer"]["chat_template"] = rel
    data = (bundle / rel).read_bytes()
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def _ids(bundle: Path, *args: str) -> list[int]:
    res = CliRunner().invoke(main, ["generate", str(bundle), "--max-new-tokens", "6", "--method", "none", "--json",
                                    *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["token_ids"]


def _plain_ids(bundle: Path, text: str) -> list[int]:
    from specrt.runtime import load

    gen = load(bundle, warmup=False)
    return gen.generate(gen.tokenizer.encode(text, add_special_tokens=False), max_new_tokens=6, method="none").token_ids


def test_the_variable_reaches_the_template(templated):
    off = _ids(templated, "--chat", "hi", "--chat-template-kwargs", '{"enable_thinking": false}')
    on = _ids(templated, "--chat", "hi", "--chat-template-kwargs", '{"enable_thinking": true}')
    assert off == _plain_ids(templated, "user: hi\nassistant: <think></think>")
    assert on == _ids(templated, "--chat", "hi") == _plain_ids(templated, "user: hi\nassistant:")


def test_prompts_file_chat_lines_get_the_variables(templated, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"chat": "hi"}) + "\n" + json.dumps("user: hi\nassistant: <think></think>") + "\n")
    res = CliRunner().invoke(main, ["generate", str(templated), "--prompts-file", str(prompts), "--max-new-tokens",
                                    "6", "--method", "none", "--max-batch", "1",
                                    "--chat-template-kwargs", '{"enable_thinking": false}'])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.output.splitlines() if x.startswith("{")]
    assert len(lines) == 2 and lines[0]["token_ids"] == lines[1]["token_ids"], lines


@pytest.mark.parametrize("args, message", [
    (["--chat", "hi", "--chat-template-kwargs", "{enable_thinking: false}"], "--chat-template-kwargs is not JSON"),
    (["--chat", "hi", "--chat-template-kwargs", '["enable_thinking"]'], "--chat-template-kwargs must be a JSON object"),
    (["--chat", "hi", "--chat-template-kwargs", '{"messages": []}'], "--chat-template-kwargs: template variables "
                                                                      "cannot set messages"),
    (["--prompt", "hi", "--chat-template-kwargs", "{}"], "--chat-template-kwargs needs --chat or --prompts-file"),
])
def test_bad_values_are_one_line(templated, args, message):
    res = CliRunner().invoke(main, ["generate", str(templated), *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith(f"error: {message}"), res.output
