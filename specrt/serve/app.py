"""`create_app(bundle_or_generators, ...)` -> a FastAPI app serving the OpenAI API with speculative decoding.

    app = create_app("artifacts/demo", max_concurrency=2, max_queue=64, api_key="secret")
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Sequence, Union

from fastapi import FastAPI, Request
from fastapi.responses import Response

from specrt.serve.config import ServeConfig
from specrt.serve.errors import install_handlers
from specrt.serve.metrics import CONTENT_TYPE
from specrt.serve.guards import CatchAll
from specrt.serve.access_log import AccessLog
from specrt.serve.middleware import ApiKeyAuth, BodyLimit, RequestMetrics
from specrt.serve.schemas import request_models
from specrt.serve.service import Service


def threads_per_slot(max_concurrency: int, threads: Optional[int] = None) -> int:
    """Split `threads` (default: all cores) evenly over the slots, at least one each."""
    total = threads or os.cpu_count() or 1
    return max(1, total // max_concurrency)


def load_generators(bundle: Union[str, Path], max_concurrency: int = 1, backend: str = "auto",
                    threads: Optional[int] = None) -> list[Any]:
    """One Generator (own runners) per slot; checksums are verified once."""
    from specrt.core.errors import InvalidArgument
    from specrt.runtime import load

    if max_concurrency < 1:
        raise InvalidArgument(f"max_concurrency must be >= 1, got {max_concurrency}")
    per_slot = threads_per_slot(max_concurrency, threads)
    return [load(bundle, backend=backend, threads=per_slot, verify_checksums=(i == 0))
            for i in range(max_concurrency)]


def create_app(bundle_or_generators: Union[str, Path, Any, Sequence[Any]], *, served_model_name: Optional[str] = None,
               api_key: Optional[str] = None, max_concurrency: int = 1, max_queue: int = 64,
               method: Optional[str] = None, num_speculative_tokens: Union[int, str] = "auto",
               backend: str = "auto", threads: Optional[int] = None, max_body_bytes: int = 1 << 20,
               body_timeout_s: float = 30.0, max_batch: Union[int, str] = 0,
               health_extra: Optional[Callable[[], Awaitable[dict[str, Any]]]] = None,
               prefix_cache_mb: Optional[float] = None) -> FastAPI:
    """A bundle path loads `max_concurrency` generators; a Generator or a list of them is used as given
    (one slot each). With an `api_key` the API docs (/docs, /redoc, /openapi.json) are off;
    `body_timeout_s` bounds how long a request body may take to arrive (408 after it); `health_extra` adds
    keys to /health (the Ray replica's name and the replica count). `max_batch` N >= 1 (a bundle path): one
    generator and N slots that are the rows of one batch (serve/batching.py) instead of one generator per slot;
    "auto": N from the device (`auto_max_batch`), or one slot without batching where the bundle cannot batch.
    `prefix_cache_mb`: the batch engine's prefix cache budget (None: its default; 0: off; runtime/batch/
    prefix_cache.py)."""
    engine = None
    if max_batch == "auto" and max_concurrency > 1:
        max_batch = 0  # several generators were asked for
    if max_batch and isinstance(bundle_or_generators, (str, Path)):
        from specrt.serve.batching import batched_engine

        gen, engine = batched_engine(bundle_or_generators, max_batch, backend, threads, prefix_cache_mb)
        generators = [gen]
    elif isinstance(bundle_or_generators, (str, Path)):
        generators = load_generators(bundle_or_generators, max_concurrency, backend, threads)
    elif isinstance(bundle_or_generators, (list, tuple)):
        generators = list(bundle_or_generators)
    else:
        generators = [bundle_or_generators]
    name = served_model_name or Path(generators[0].manifest.root).resolve().name
    config = ServeConfig(served_model_name=name, api_key=api_key, max_queue=max_queue, method=method,
                         num_speculative_tokens=num_speculative_tokens, max_body_bytes=max_body_bytes)
    service = Service(generators, config, engine)
    if engine is not None:
        from specrt.serve.batching import add_batch_metrics

        add_batch_metrics(service.metrics, engine)
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        service.close()
        if engine is not None:
            engine.close()

    # A body without Content-Type is parsed as JSON (curl -d habits); newer FastAPI needs it said.
    lenient = {"strict_content_type": False} if "strict_content_type" in inspect.signature(FastAPI).parameters else {}
    # The interactive docs describe the API to anyone: off when the server has a key.
    docs = {"docs_url": None, "redoc_url": None, "openapi_url": None} if api_key else {}
    app = FastAPI(title="specrt", summary="OpenAI-compatible server with speculative decoding",
                  lifespan=lifespan, **lenient, **docs)
    app.state.service = service
    app.state.engine = engine
    install_handlers(app)
    # Middleware: the last added runs first: metrics -> auth -> body limit -> catch-all -> routes.
    app.add_middleware(CatchAll)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, timeout_s=body_timeout_s)
    app.add_middleware(ApiKeyAuth, api_key=config.api_key)
    app.add_middleware(RequestMetrics, metrics=service.metrics)
    app.add_middleware(AccessLog)  # outermost: one line per request, after the response

    methods = list(service.generator.methods)  # what this bundle runs in this mode: advertised == accepted
    completion_body, chat_body = request_models(methods)

    async def completions(body: Any, request: Request) -> Response:
        return await service.completion(request, body)

    async def chat_completions(body: Any, request: Request) -> Response:
        return await service.chat_completion(request, body)

    completions.__annotations__.update(body=completion_body, request=Request)  # the models are built per app
    chat_completions.__annotations__.update(body=chat_body, request=Request)
    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat_completions)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        gen = service.generator
        return {"object": "list", "data": [{
            "id": config.served_model_name, "object": "model", "created": started, "owned_by": "specrt",
            "max_model_len": gen.max_seq_len, "speculative_methods": methods,
            "max_num_speculative_tokens": gen.max_draft_tokens}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        pool = service.pool
        body = {"status": "ok", "model": config.served_model_name, "slots": pool.size, "busy": pool.busy,
                "queued": pool.waiting, "max_queue": pool.max_queue}
        return {**body, **(await health_extra())} if health_extra else body

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    return app
