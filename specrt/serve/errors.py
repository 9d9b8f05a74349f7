"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status.

| status | when | type / code |
|---|---|---|
| 400 | invalid JSON, wrong field types, out-of-range values, unknown model, n outside [1, 16] | invalid_request_error |
| 401 | missing or wrong API key (when the server has one) | invalid_request_error / invalid_api_key |
| 404 | unknown path | invalid_request_error / not_found |
| 413 | body larger than the limit (1 MiB by default) | invalid_request_error / request_too_large |
| 429 | every slot busy and the wait queue full (with `Retry-After`) | rate_limit_error / queue_full |
| 500 | a failure inside the server | server_error |
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specrt.core.errors import InvalidArgument

log = logging.getLogger("specrt.serve")


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type: str = "invalid_request_error", headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers


def error_body(message: str, type: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.message, err.type, err.param, err.code), status_code=err.status,
                        headers=err.headers)


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# what a field of a union type accepts (pydantic reports one error per member; one sentence reads better)
EXPECTED = {
    "prompt": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "temperature": "a number", "top_p": "a number", "stop": "a string or a list of strings",
    "content": "a string or a list of text parts", "num_speculative_tokens": "an integer or 'auto'",
}


FASTAPI_BODY_ERROR = "There was an error parsing the body"  # FastAPI's words where json.loads raised other than
# a JSONDecodeError (invalid UTF-8, a RecursionError on deep nesting)


def _is_type_tag(part: object) -> bool:  # pydantic names the union member it tried: 'str', 'list[int]'...
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def validation_error(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 -> OpenAI's 400, naming the first offending field."""
    errors = exc.errors()
    first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_type_tag(p)]
    if loc and any(_is_type_tag(p) for p in first.get("loc", ())) and loc[-1] in EXPECTED:
        first = {**first, "msg": f"expected {EXPECTED[loc[-1]]}"}
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return bad_request(f"the request body is not valid JSON ({detail})".replace(" ()", ""))
    if not loc:
        if first.get("type") == "missing":  # no body at all
            return bad_request("the request body is empty: send a JSON object (Content-Type: application/json)")
        if isinstance(first.get("input"), (bytes, str)):
            return bad_request("the request body must be a JSON object (send Content-Type: application/json)")
        return bad_request(f"the request body must be a JSON object: {first.get('msg')}")
    where = ".".join(loc)
    if first.get("type") == "missing":
        return bad_request(f"missing required field {where!r}", param=where)
    return bad_request(f"invalid value for {where!r}: {first.get('msg')} (got {first.get('input')!r:.80})",
                       param=where)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(InvalidArgument)
    async def _invalid(request: Request, exc: InvalidArgument) -> JSONResponse:
        return error_response(bad_request(str(exc)))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == FASTAPI_BODY_ERROR:  # the body could not be decoded at all
            detail = "the request body is not valid JSON: not UTF-8, or nested too deeply"
        return error_response(APIError(exc.status_code, detail, code=code,
                                       headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return error_response(APIError(500, f"internal server error: {type(exc).__name__}: {exc}",
                                       type="server_error"))
