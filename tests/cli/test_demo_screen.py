"""`specrt demo` in a real terminal (issue 15, item 1): run under a pseudo-terminal, rendered by pyte."""

import re
import shutil

import pytest

from pty_screen import run_in_terminal


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, llama_target, llama_draft):
    d = tmp_path_factory.mktemp("pair")
    shutil.copytree(llama_target, d / "target")
    shutil.copytree(llama_draft, d / "draft")
    return d


def _results_fit(lines, raw, columns):
    """Four results (one per prompt), none erased by a live display, full-width rules, every line in `columns`."""
    screen = "\n".join(lines)
    results = [i for i, line in enumerate(lines) if line.startswith("identical to plain: True")]
    assert len(results) == 4, screen  # one per prompt, none erased by a live display
    rules = [i for i, line in enumerate(lines) if line.startswith("─")]
    assert len(rules) == 5 and all(len(lines[i]) == columns for i in rules), screen  # full rules, nothing run into them
    titles = [lines[i].strip("─ ") for i in rules]
    assert len(set(titles)) == 5 and titles[-1] == "overall: every prompt", titles  # no title repeats another
    assert titles[0].endswith("(1 of 4)") and titles[3].endswith("(4 of 4)"), titles
    assert "[cut off: the answer reached --max-new-tokens 12]" in screen, screen  # 12 tokens: the answers are cut
    assert re.search(r"speedup \d+\.\d\dx \(median; \d+\.\d\d-\d+\.\d\d over 2 repeats\)", screen), screen
    assert all(len(line) <= columns for line in lines)
    for i in range(1, 5):
        assert f"prompt {i}/4" in raw  # shown while measuring (a transient line)
        assert f"prompt {i}/4" not in screen  # and gone once the result is printed
    return results


@pytest.mark.slow  # compiles the pair and runs the demo in a pseudo-terminal, twice
def test_demo_results_stay_on_screen(tmp_path, tiny_pair):
    """80 columns: the compile block once, above the results; then 100 columns: the bundle reused, the same
    layout at that width (one compile between the two widths: each is a real process)."""
    args = ["demo", "--models", tiny_pair, "--max-new-tokens", 12, "--repeats", 2]
    lines, raw, status = run_in_terminal(args, cwd=tmp_path, columns=80)
    assert status == 0, "\n".join(lines)
    first = next(line for line in lines if line.strip())
    assert first.startswith("compiling the demo pair into artifacts/demo"), "\n".join(lines)
    results = _results_fit(lines, raw, 80)
    steps = [i for i, line in enumerate(lines) if "export target to ONNX" in line]
    assert len(steps) == 1 and steps[0] < results[0], "the compile block is printed once, above the results"

    lines, raw, status = run_in_terminal(args, cwd=tmp_path, columns=100)
    assert status == 0, "\n".join(lines)
    assert next(line for line in lines if line.strip()).startswith("reusing the compiled demo bundle artifacts/demo")
    assert not any("export target" in line for line in lines)
    _results_fit(lines, raw, 100)


def test_demo_repeats_zero_is_a_usage_error(tmp_path, tiny_pair):
    lines, raw, status = run_in_terminal(["demo", "--models", tiny_pair, "--repeats", 0], cwd=tmp_path, columns=120)
    assert status == 2
    assert lines == ["error: Invalid value for '--repeats': 0 is not in the range x>=1. (see 'specrt demo --help')"]
