"""A runtime without torch: with `import torch` refused (as if only `specrt[cpu]` were installed), a compiled
bundle loads and decodes through every front end (generate with plain and speculative methods, inspect,
bench, the OpenAI server), and compiling says in one line which extra to install."""

from __future__ import annotations

import json

import pytest

from import_blocker import run_blocked

NO_TORCH = ["torch"]


def cli(*args: str) -> str:
    return f"from specrt.cli.main import main\nmain({[str(a) for a in args]!r})\n"


def test_runtime_modules_import_without_torch():
    code = """
import sys
import specrt.runtime, specrt.runtime.backends.ort, specrt.bundle, specrt.cli.describe, specrt.bench.runner
import specrt.cli.main, specrt.serve, specrt.runtime.chat_template
assert "torch" not in sys.modules
print("ok")
"""
    proc = run_blocked(NO_TORCH, code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["none", "draft", "ngram", "hybrid"])
@pytest.mark.parametrize("pair_generator", ["ort"], indirect=True)  # the processes run --backend ort
def test_generate_without_torch_equals_generate_with_it(pair_bundle, pair_generator, method):
    prompt = "def main(args):\n    "
    proc = run_blocked(NO_TORCH, cli("generate", pair_bundle, "--prompt", prompt, "--max-new-tokens", "16",
                                     "--method", method, "--num-speculative-tokens", "2", "--backend", "ort",
                                     "--json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    ref = pair_generator.generate(prompt, 16, method="none", temperature=0)
    assert got["token_ids"] == ref.token_ids  # greedy speculative output equals target-only output
    if method != "none":
        assert got["stats"]["verify_steps"] > 0


@pytest.mark.slow
def test_inspect_bench_and_serve_without_torch(pair_bundle, tmp_path):
    proc = run_blocked(NO_TORCH, cli("inspect", pair_bundle))
    assert proc.returncode == 0 and "target" in proc.stdout, proc.stderr[-3000:]
    out = tmp_path / "bench.json"
    proc = run_blocked(NO_TORCH, cli("bench", pair_bundle, "--suite", "code", "--prompts-per-suite", "1", "--k", "2",
                                     "--max-new-tokens", "12", "--repeats", "1", "--methods", "draft,ngram",
                                     "--backend", "ort", "--json", out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())  # the numbers were written
    proc = run_blocked(NO_TORCH, f"""
import sys
from fastapi.testclient import TestClient
from specrt.serve import create_app
with TestClient(create_app({str(pair_bundle)!r}, served_model_name="tiny", backend="ort")) as client:
    r = client.post("/v1/completions", json={{"model": "tiny", "prompt": "def main(", "max_tokens": 6,
                                              "temperature": 0}})
    assert r.status_code == 200, r.text
    print(r.json()["usage"]["completion_tokens"], "torch" in sys.modules)
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["6", "False"]


def test_compile_without_torch_names_the_extra(llama_target, tmp_path):
    proc = run_blocked(NO_TORCH, cli("compile", "--target", llama_target, "-o", tmp_path / "b"))
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and 'pip install "specrt[compile]"' in lines[0] and "torch" in lines[0], proc.stderr
    assert not (tmp_path / "b").exists()
