"""Built-in workload suites and `--prompts FILE.jsonl`.

    code      code completion: the start of a function or class, continued
    grounded  the answer repeats much of the prompt (editing, extraction): a function or class followed
              by the start of a near copy, which a model trained on Python source continues by copying
    open      open-ended: a docstring or comment with little to copy from

Speculation pays most on `grounded` (n-gram lookup finds long matches) and least on `open`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from specrt.core.errors import InvalidArgument

SUITES = ("code", "grounded", "open")


@dataclasses.dataclass(frozen=True)
class Prompt:
    suite: str
    text: str


BUILTIN: dict[str, list[str]] = {
    "code": [
        'import os\nimport sys\n\n\ndef main(argv=None):\n    """Command line entry point."""\n'
        "    if argv is None:\n        argv = sys.argv[1:]\n",
        "class Queue:\n    def __init__(self, maxsize=0):\n        self.maxsize = maxsize\n",
        "def read_lines(path, encoding='utf-8'):\n    with open(path, encoding=encoding) as f:\n",
    ],
    "grounded": [
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
        "    def __repr__(self):\n        return 'Point(%r, %r)' % (self.x, self.y)\n\n"
        "    def __eq__(self, other):\n        return self.x == other.x and self.y == other.y\n\n\n"
        "class Point3D:\n    def __init__(self, x, y, z):\n",
        "def load_config(path):\n    \"\"\"Read the configuration file at path.\"\"\"\n"
        "    with open(path) as f:\n        data = f.read()\n    result = {}\n"
        "    for line in data.splitlines():\n        line = line.strip()\n"
        "        if not line or line.startswith('#'):\n            continue\n"
        "        key, _, value = line.partition('=')\n        result[key.strip()] = value.strip()\n"
        "    return result\n\n\ndef load_config_file(path):\n    \"\"\"Read the configuration file at path.\"\"\"\n",
        "    def get_name(self):\n        return self._name\n\n    def set_name(self, value):\n"
        "        self._name = value\n\n    def get_size(self):\n        return self._size\n\n"
        "    def set_size(self, value):\n        self._size = value\n\n    def get_mode(self):\n",
    ],
    "open": [
        '"""',
        "# ",
        "\n\n",
    ],
}


def builtin_prompts(suites: list[str], per_suite: int) -> list[Prompt]:
    if per_suite < 1:
        raise InvalidArgument(f"--prompts-per-suite must be >= 1, got {per_suite}")
    for s in suites:
        if s not in BUILTIN:
            raise InvalidArgument(f"unknown suite {s!r}; choose from {', '.join(SUITES)} (or give --prompts FILE.jsonl)")
    return [Prompt(s, text) for s in suites for text in BUILTIN[s][:per_suite]]


def load_prompts(path: Path, suites: list[str] | None = None) -> list[Prompt]:
    """Lines of {"prompt": ..., "suite": ...} (suite defaults to "custom"); blank lines are skipped."""
    from specrt.core.textfile import PROMPTS_MAX_BYTES, read_user_text

    lines = read_user_text(path, "--prompts", PROMPTS_MAX_BYTES).splitlines()
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        item = json_line(line, f"{path}:{no}")
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise InvalidArgument(f'{path}:{no}: expected {{"prompt": "...", "suite": "..."}}')
        suite = str(item.get("suite") or "custom")
        if suites is None or suite in suites:
            out.append(Prompt(suite, item["prompt"]))
    if not out:
        wanted = f" in suites {', '.join(suites)}" if suites else ""
        raise InvalidArgument(f"{path}: no prompts{wanted}")
    return out


def json_line(line: str, where: str):
    """One line of a JSONL file the user names, parsed; InvalidArgument naming `where` (FILE:LINE) otherwise."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{where}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise InvalidArgument(f"{where}: nested too deeply") from None
