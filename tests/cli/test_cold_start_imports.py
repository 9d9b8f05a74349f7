"""`specrt generate BUNDLE --max-new-tokens 1` (the cold-start path) imports only what decoding needs: no other
command's module (the CLI registers commands lazily), no compiler, bench or server, no rich (the loading line is
shown on terminals only), no jinja2 (no chat template for --prompt), no onnx, no torch. The blocked packages are
refused outright, as if not installed, and the one-token run still succeeds."""

from __future__ import annotations

import json

from import_blocker import run_blocked

BLOCKED = ["rich", "jinja2", "fastapi", "uvicorn", "torch", "onnx", "transformers"]
NOT_LOADED = ("specrt.compiler", "specrt.bench", "specrt.serve", "specrt.cli.progress", "specrt.cli.describe",
              "specrt.cli.commands.core", "specrt.cli.commands.bench", "specrt.cli.commands.serve",
              "specrt.cli.commands.demo", "specrt.cli.commands.train", "specrt.cli.commands.train_head",
              "specrt.runtime.batch", "specrt.runtime.chat_template")


def test_one_token_generate_imports_only_the_decoding_path(lean_int4_bundle):
    code = f"""
import json, sys
from specrt.cli.main import main
try:
    main(["generate", {str(lean_int4_bundle)!r}, "--prompt", "def main(args):", "--max-new-tokens", "1",
          "--method", "none"])
except SystemExit as exc:
    code = exc.code
print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""
    proc = run_blocked(BLOCKED, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, proc.stderr[-3000:]
    loaded = [m for m in result["modules"] if m.startswith(NOT_LOADED) or m.split(".")[0] in BLOCKED]
    assert not loaded, loaded
    assert "specrt.cli.commands.generate" in result["modules"] and "onnxruntime" in result["modules"]
