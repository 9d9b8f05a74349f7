"""The README's commands, executed as written (on tiny checkpoints named like the README's)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def marked_blocks(kind):
    pattern = rf"<!-- readme-test: {kind} -->\n```\w+\n(.*?)```"
    return re.findall(pattern, README, flags=re.S)


def quick_start_commands():
    return re.findall(r"```bash\n(pip install torch[^\n]*)\n```", README)


def test_ci_runs_the_readme_test_command():
    install_demo, install_test = quick_start_commands()[:2]
    assert install_demo.endswith("specrt demo")
    assert install_test.endswith("python -m pytest -q")
    assert install_test in (ROOT / ".ci" / "run").read_text()


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory, llama_target, llama_draft):
    d = tmp_path_factory.mktemp("readme")
    shutil.copytree(llama_target, d / "my-target")
    shutil.copytree(llama_draft, d / "my-draft")
    return d


def test_readme_cli_and_python_blocks_run(readme_dir):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    (bash,) = marked_blocks("bash")
    for line in bash.strip().splitlines():
        proc = subprocess.run(line, shell=True, cwd=readme_dir, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stderr}"
    assert (readme_dir / "artifacts" / "my-pair" / "manifest.json").exists()
    (py,) = marked_blocks("python")
    proc = subprocess.run([sys.executable, "-c", py], cwd=readme_dir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
