"""Run a command in a pseudo-terminal (pexpect) and render what a user sees with a terminal emulator (pyte)."""

from __future__ import annotations

import os
import sys

import pexpect
import pyte


def run_in_terminal(args: list[str], cwd, columns: int = 80, rows: int = 200, timeout: int = 600,
                    env: dict | None = None) -> tuple[list[str], str, int]:
    """Returns (screen lines with trailing blanks stripped, the raw output, exit status)."""
    full_env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(rows),
                **(env or {})}
    full_env.pop("NO_COLOR", None)
    child = pexpect.spawn(sys.executable, ["-m", "specrt", *map(str, args)], cwd=str(cwd), env=full_env,
                          dimensions=(rows, columns), encoding="utf-8", codec_errors="replace", timeout=timeout)
    raw = []
    while True:
        try:
            raw.append(child.read_nonblocking(65536, timeout=timeout))
        except pexpect.EOF:
            break
    child.close()
    text = "".join(raw)
    screen = pyte.Screen(columns, rows)
    stream = pyte.Stream(screen)
    stream.feed(text.replace("\n", "\r\n") if "\r\n" not in text else text)
    lines = [line.rstrip() for line in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return lines, text, child.exitstatus if child.exitstatus is not None else -(child.signalstatus or 0)
