"""specrt/console.py and the demo's terminal pieces: packing, spread, busy warning, flag names, repeats."""

import io

import pytest
from rich.console import Console

from specrt.cli.console import busy_warning, check_repeats, flag_names, pack, require, spread
from specrt.cli.demo_screen import DemoScreen
from specrt.core.errors import InvalidArgument, MissingDependency


def test_pack_never_breaks_a_phrase():
    phrases = ["identical to plain: True", "acceptance 0.65", "mean accepted 2.21", "plain 210 tok/s",
               "speculative 289 tok/s", "speedup 1.38x (1.20-1.50)"]
    lines = pack(phrases, 60)
    assert all(len(line) <= 60 for line in lines) and len(lines) == 3
    assert "   ".join(lines) == "   ".join(phrases)


def test_flag_names_and_spread_and_repeats():
    assert flag_names("max_new_tokens must be >= 1; num_speculative_tokens=9") == \
        "--max-new-tokens must be >= 1; --num-speculative-tokens=9"
    assert flag_names("the bundle's max_seq_len=512") == "the bundle's max_seq_len=512"
    assert spread([1.2, 1.5, 1.4]) == {"median": 1.4, "min": 1.2, "max": 1.5}
    with pytest.raises(InvalidArgument, match="--repeats must be an integer >= 1, got 0"):
        check_repeats(0)
    # the one MissingDependency (specrt.core.errors), exit 2 like the compile extra's
    with pytest.raises(MissingDependency, match=r"--plot needs no_such_module_x, which is not installed: "
                                                r"pip install 'specrt\[bench\]'") as caught:
        require("no_such_module_x", "--plot", "bench")
    assert caught.value.exit_code == 2


def test_busy_warning(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("os.getloadavg", lambda: (5.8, 4.0, 2.0))
    assert busy_warning().startswith("warning: the machine is busy (load average 5.8 on 2 cores)")
    monkeypatch.setattr("os.getloadavg", lambda: (1.5, 1.0, 1.0))
    assert busy_warning() is None


def test_demo_screen_prints_spread_and_busy_warning_without_breaking_phrases(monkeypatch):
    monkeypatch.setattr("specrt.cli.demo_screen.busy_warning",
                        lambda: "warning: the machine is busy (load average 5.8 on 2 cores): speedups vary")
    buf = io.StringIO()
    screen = DemoScreen(Console(file=buf, width=80, force_terminal=False))
    row = {"kind": "code", "prompt": "def f(", "text": "x):", "identical": True, "acceptance_rate": 0.65,
           "mean_accepted_tokens": 2.21, "plain_tokens_per_second": 210.0, "speculative_tokens_per_second": 289.0,
           "speedup": 1.38, "speedup_min": 1.2, "speedup_max": 1.5}
    screen.start(1, 4, "code")
    screen.row(row)
    screen.summary({"backend": "ort", "method": "draft", "summary": {
        "identical": True, "acceptance_rate": 0.7, "plain_tokens_per_second": 150.0,
        "speculative_tokens_per_second": 190.0, "speedup": 1.27, "speedup_min": 1.1, "speedup_max": 1.4, "repeats": 3}})
    out = buf.getvalue()
    assert "prompt 1/4 (code): measuring" in out  # not a terminal: a plain line instead of a spinner
    assert "speedup 1.38x (1.20-1.50)" in out and "speedup 1.27x (median; 1.10-1.40 over 3 repeats)" in out
    assert "warning: the machine is busy (load average 5.8 on 2 cores):" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_run_demo_validates_repeats(tmp_path):
    from specrt.cli.demo import run_demo

    with pytest.raises(InvalidArgument, match="--repeats must be an integer >= 1, got 0"):
        run_demo(tmp_path / "out", repeats=0)
    assert not (tmp_path / "out").exists()
