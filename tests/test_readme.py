"""The README and docs/: short, current, and their commands executed as written (on tiny checkpoints named
like the README's)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def marked_blocks(kind):
    pattern = rf"<!-- readme-test: {kind} -->\n```\w+\n(.*?)```"
    return re.findall(pattern, README, flags=re.S)


def quick_start_commands():
    return re.findall(r"```bash\n(pip install torch[^\n]*)\n```", README)


def test_ci_runs_the_readme_test_command():
    install_demo, install_test = quick_start_commands()[:2]
    assert install_demo.endswith("specrt demo")
    assert install_test.endswith("python -m pytest -q -n 2 --dist loadfile")
    assert install_test in (ROOT / ".ci" / "run").read_text()


def test_readme_is_short_and_maps_every_docs_page():
    assert len(README.encode()) <= 10 * 1024, f"README.md is {len(README.encode())} bytes; the limit is 10 KB"
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README))
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert pages <= linked, f"docs pages missing from the README's map: {sorted(pages - linked)}"
    for row in README.splitlines():  # pages others are still writing are marked so; every other link resolves
        for target in re.findall(r"\]\(([\w./-]+\.md)\)", row):
            assert (ROOT / target).is_file() or "being written" in row, f"README links a missing file: {target}"
    for topic in ("cli", "python-api", "bundle-format", "drafting", "quantization", "serving", "gpu-tensorrt",
                  "benchmarks"):
        assert (DOCS / f"{topic}.md").is_file(), topic


def test_standings_link_benchmarks_and_quote_its_ratios():
    """The README's table of standings quotes BENCHMARKS.md: every ratio in it appears there."""
    section = README.split("## Where it stands", 1)[1].split("\n## ", 1)[0]
    assert "(BENCHMARKS.md)" in section
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    ratios = re.findall(r"\b(\d\.\d\d)x", section)
    assert len(ratios) >= 8
    for ratio in ratios:
        assert re.search(rf"(?<![\d.]){re.escape(ratio)}(?!\d)", benchmarks), f"{ratio}x is not in BENCHMARKS.md"


def test_docs_links_resolve():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)", page.read_text()):
            if target.startswith("http"):
                continue
            assert (page.parent / target).resolve().is_file(), f"{page.name} links a missing file: {target}"


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory, llama_target, llama_draft):
    d = tmp_path_factory.mktemp("readme")
    shutil.copytree(llama_target, d / "my-target")
    shutil.copytree(llama_draft, d / "my-draft")
    return d


@pytest.mark.slow
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
