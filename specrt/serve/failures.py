"""What a request that ended with an error answers: an `APIError` (status, OpenAI error body) for its `Done`."""

from __future__ import annotations

from specrt.core.errors import InvalidArgument
from specrt.serve.errors import APIError
from specrt.serve.slots import ServerShuttingDown
from specrt.serve.worker import Done


def failure(done: Done) -> APIError:
    from specrt.runtime.constraint import ConstraintError

    return constraint_failure(done.error) if isinstance(done.error, ConstraintError) else _other_failure(done)


def constraint_failure(error: BaseException, tools: bool = False) -> APIError:
    """A schema that failed to compile, past the compile limits, or found while decoding to be past the parser's
    limits: 400 naming `response_format` (or `tools`, for a forced tool call's schema); the compile threads busy:
    503, retry."""
    from specrt.runtime.constraint_pool import CompilerBusy

    if isinstance(error, CompilerBusy):
        return APIError(503, str(error), type="server_error", code="compiler_busy", headers={"Retry-After": "1"})
    if tools:
        return APIError(400, f"cannot decode under the tool parameters schema: {error}", param="tools",
                        code="invalid_tool_schema")
    return APIError(400, str(error), param="response_format", code="invalid_response_format")


def shutting_down(error: ServerShuttingDown) -> APIError:
    """A request the server's shutdown cut off (its grace period over): 503, retry (on another replica)."""
    return APIError(503, str(error), type="server_error", code="server_shutting_down", headers={"Retry-After": "1"})


def _other_failure(done: Done) -> APIError:
    if isinstance(done.error, InvalidArgument):
        return APIError(400, str(done.error))
    if isinstance(done.error, ServerShuttingDown):
        return shutting_down(done.error)
    return APIError(500, f"generation failed: {type(done.error).__name__}: {done.error}", type="server_error")
