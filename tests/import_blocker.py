"""Run Python code in a subprocess where some top-level packages cannot be imported (as if not installed).

    proc = run_blocked(["fastapi", "torch"], "from specrt.cli.main import main; main(['inspect', 'B'])")

A `sys.meta_path` finder placed first refuses the named packages (and their submodules) with
ModuleNotFoundError, exactly what a missing extra gives; `find_spec` probes (`importlib.util.find_spec`)
answer None, as for an absent package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

BLOCKER = '''
import importlib.abc, importlib.util, sys
_BLOCKED = set({blocked!r})
class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None
_find_spec = importlib.util.find_spec
def _probe(name, package=None):
    if name.split(".")[0] in _BLOCKED:
        return None
    return _find_spec(name, package)
importlib.util.find_spec = _probe
sys.meta_path.insert(0, _Blocker())
for _m in [m for m in sys.modules if m.split(".")[0] in _BLOCKED]:
    del sys.modules[_m]
'''


def run_blocked(blocked: Sequence[str], code: str, timeout: float = 600, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=sorted(blocked)) + code],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
