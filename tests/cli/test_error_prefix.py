"""Every error the `specrt` command prints begins `error:` (lower case, one line), click's own usage errors
included: a report saw `Error:` (click's prefix) beside ours."""

import subprocess
import sys

import pytest
from click.testing import CliRunner

from specrt.cli.main import main, register_all

register_all()
COMMANDS = sorted(main.commands)


@pytest.mark.parametrize("command", COMMANDS)
def test_usage_errors_of_every_command_begin_lower_case(command):
    for args in ([command, "--no-such-flag"], [command, "--help", "--no-such-flag"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, res.output
        assert res.output.startswith("error: No such option '--no-such-flag'"), res.output
        assert len(res.output.strip().splitlines()) == 1 and "Error:" not in res.output, res.output


def test_a_missing_option_value_and_the_group_itself():
    for args in (["generate", "b", "--prompt"], ["--no-such-flag"], ["no-such-command"], ["generate"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and res.output.startswith("error: "), (args, res.output)
        assert "Error:" not in res.output and len(res.output.strip().splitlines()) == 1, (args, res.output)


def test_python_dash_m_specrt_says_error_in_lower_case(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specrt", "generate", str(tmp_path / "none"), "--prompt", "x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: bundle "), proc.stderr


@pytest.mark.parametrize("name, make", [("demo", "specrt demo --offline"), ("demo-smollm2", "specrt demo"),
                                        ("my-pair", "create one with `specrt compile`")])
def test_a_missing_demo_bundle_names_the_command_that_makes_it(tmp_path, name, make):
    """docs/benchmarks.md's `specrt bench artifacts/demo` before `specrt demo --offline` said `specrt compile`."""
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "artifacts" / name)])
    assert res.exit_code != 0 and res.output.startswith(f"error: bundle {tmp_path / 'artifacts' / name} does not exist")
    assert make in res.output and len(res.output.strip().splitlines()) == 1, res.output
