"""What `specrt demo` prints on a terminal, in order: whether it compiles or reuses the bundle, the compile
steps (a live display that is stopped before anything else is printed), "prompt i/N" while measuring
(a transient status line, stopped before each result), one block per prompt, the summary, and a
warning when the machine is busy. Nothing here redraws over printed results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.cli.console import busy_warning, pack


OVERALL_TITLE = "overall: every prompt"  # not "summary", which is also a prompt kind


def block_title(row: dict[str, Any]) -> str:
    """'summary (2 of 3)': the prompt's kind and its place, so no block title repeats another."""
    return f"{row['kind']} ({row['index']} of {row['of']})" if "index" in row else row["kind"]


class DemoScreen:
    def __init__(self, console, chat: bool = False) -> None:
        self.console = console  # rich Console (stdout)
        self.chat = chat  # chat prompts: the reply starts on its own line
        self.status = None

    def announce(self, current: bool, bundle: Path, model: str = "the demo pair", estimate: str = "about a minute"
                 ) -> None:
        """`estimate`: what the compile took where it was measured (SmolLM2: 5.5 minutes on 2 cores)."""
        if current:
            self.console.print(f"reusing the compiled demo bundle {bundle} (current)", markup=False)
        else:
            self.console.print(f"compiling {model} into {bundle} (first run or stale; {estimate})", markup=False)

    def warn_if_busy(self) -> None:
        warning = busy_warning()
        if warning:
            head, tail = warning.split("): ", 1)
            for line in pack([head + "):", tail], self.console.width, sep=" "):
                self.console.print(line, markup=False, style="yellow", soft_wrap=True)

    def start(self, i: int, n: int, kind: str) -> None:
        text = f"prompt {i}/{n} ({kind}): measuring plain and speculative decoding..."
        if not self.console.is_terminal:
            self.console.print(text, markup=False, style="dim")
            return
        self.status = self.console.status(text)
        self.status.start()

    def _stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def row(self, row: dict[str, Any]) -> None:
        self._stop()
        c = self.console
        c.rule(f"[bold]{block_title(row)}[/bold]")
        c.print(row["prompt"], end="\n" if self.chat else "", markup=False, style="dim")  # code continues inline
        c.print(row["text"], markup=False, style="green")
        if row.get("finish_reason") == "length":  # say so rather than end mid-word
            c.print(f"[cut off: the answer reached --max-new-tokens {row['new_tokens']}]", markup=False,
                    style="yellow")
        phrases = [f"identical to plain: {row['identical']}", f"acceptance {row['acceptance_rate']:.2f}",
                   f"mean accepted {row['mean_accepted_tokens']:.2f}",
                   f"plain {row['plain_tokens_per_second']:.0f} tok/s",
                   f"speculative {row['speculative_tokens_per_second']:.0f} tok/s",
                   f"speedup {row['speedup']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f})"]
        for line in pack(phrases, c.width):
            c.print(line, markup=False, soft_wrap=True)

    def summary(self, result: dict[str, Any]) -> None:
        self._stop()
        s, c = result["summary"], self.console
        c.rule(f"[bold]{OVERALL_TITLE}[/bold]")
        phrases = [f"backend {result['backend']}, method {result['method']}:",
                   f"outputs identical on every prompt: {s['identical']};", f"acceptance {s['acceptance_rate']:.2f};",
                   f"plain {s['plain_tokens_per_second']:.0f} tok/s,",
                   f"speculative {s['speculative_tokens_per_second']:.0f} tok/s:",
                   f"speedup {s['speedup']:.2f}x (median; {s['speedup_min']:.2f}-{s['speedup_max']:.2f} "
                   f"over {s['repeats']} repeats)"]
        for line in pack(phrases, c.width, sep=" "):
            c.print(line, markup=False, soft_wrap=True)
        self.warn_if_busy()
