"""The `specrt` command line. Thin: each command parses options and calls one library function.

Exit codes: 0 success, 2 usage errors and bad input, 1 runtime failures. No tracebacks for errors a
user can cause (set SPECRT_DEBUG=1 to see one anyway).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable

import click

from specrt.cli.console import flag_names
from specrt.core.errors import InvalidArgument, SpecrtError


def fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Turn library errors into one line on stderr and the documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from specrt.core.interrupt import install, interrupted

        install()
        try:
            return fn(*args, **kwargs)
        except SpecrtError as exc:
            if interrupted():  # a Ctrl-C a library turned into another error (an interrupted import)
                fail("interrupted", 130)
            if os.environ.get("SPECRT_DEBUG"):
                raise
            # CLI errors name flags (--max-new-tokens), not the API parameters (max_new_tokens).
            message = flag_names(str(exc)) if isinstance(exc, InvalidArgument) else str(exc)
            fail(message, exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as exc:  # an unexpected failure: still no traceback for the user
            if interrupted():
                fail("interrupted", 130)
            if os.environ.get("SPECRT_DEBUG"):
                raise
            fail(f"{type(exc).__name__}: {exc} (set SPECRT_DEBUG=1 for a traceback)", 1)

    return wrapper


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


class KType(click.ParamType):
    """--num-speculative-tokens: an integer or 'auto'."""

    name = "K|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from specrt.core.errors import InvalidArgument
        from specrt.runtime.request import parse_k

        try:
            return parse_k(value)
        except InvalidArgument as exc:
            self.fail(str(exc), param, ctx)


_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())
SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what `yes | head` reports for `yes`


class Command(click.Command):
    """A single-valued option given twice is a usage error (click would keep the last one silently:
    `--draft self:int4 --draft DIR`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        except click.ClickException:
            order = []  # the real parse below reports it
        seen: set[str] = set()
        for param in order:
            if isinstance(param, click.Option) and not (param.multiple or param.count or param.is_flag):
                if param.name in seen:
                    raise click.UsageError(f"{param.opts[-1]} given more than once: give it once", ctx=ctx)
                seen.add(param.name)
        return super().parse_args(ctx, args)


def _quiet_broken_pipe() -> None:
    """The reader of our stdout went away (`specrt generate ... | head`): exit quietly, as Unix tools do."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    except (OSError, ValueError):
        pass
    sys.exit(SIGPIPE_EXIT)


_FAST_EXIT: list[bool] = []


def exit_fast_when_done() -> None:
    """Called by a command that has written all its output and leaves nothing running (`generate`): when it
    returns, the process ends at once instead of tearing down (freeing ONNX Runtime sessions and their thread
    pools, finalizing modules: ~0.15 s of a one-token `specrt generate` on 2 cores)."""
    _FAST_EXIT.append(True)


def _exit_now(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    os._exit(code)


class Group(click.Group):
    """Click's own usage errors printed like every other error: one `error: ...` line. Commands are registered
    lazily (`COMMAND_MODULES`): looking one up imports its module only."""

    command_class = Command

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            import importlib

            importlib.import_module(f"specrt.cli.commands.{COMMAND_MODULES[cmd_name]}")
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        register_all()
        return super().list_commands(ctx)

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            fail("interrupted", 130)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except _NO_ARGS as exc:  # `specrt` alone: the help text, as click prints it
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            hint = ""
            ctx = getattr(exc, "ctx", None)
            if isinstance(exc, click.UsageError) and ctx is not None:
                hint = f" (see '{ctx.command_path} --help')"
            fail(exc.format_message() + hint, exc.exit_code)
        code = rv if isinstance(rv, int) else 0
        if args is None and _FAST_EXIT:  # this process's own command line (not a test calling main([...]))
            _exit_now(code)
        sys.exit(code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specrt")
def main() -> None:
    """specrt: speculative decoding for LLM inference, compiled ahead of time."""


# command -> the module of specrt.cli.commands that defines it: a command line imports only its command's module
# (`specrt generate` does not pay for bench, serve or the trainers); `--help` and the docs import them all.
COMMAND_MODULES = {"bench": "bench", "compile": "core", "generate": "generate", "inspect": "core", "demo": "demo",
                   "serve": "serve", "store": "store", "distill-draft": "train", "train-medusa": "train",
                   "train-head": "train_head"}


def register_all() -> None:
    """Import every module of specrt.cli.commands; each adds its commands to `main`."""
    import importlib
    import pkgutil

    from specrt.cli import commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        importlib.import_module(f"{commands.__name__}.{info.name}")
