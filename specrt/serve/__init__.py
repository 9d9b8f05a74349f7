"""specrt.serve: an OpenAI-compatible HTTP server (FastAPI + uvicorn) with speculative decoding.

Module map: app.py (create_app, routes), schemas.py (request bodies), requests.py (validation -> Job),
service.py (responses, JSON and SSE), slots.py (generator pool, wait queue, cancellable runs),
worker.py (the worker-thread loop: detokenize, stop strings); chat templates: specrt.runtime.chat_template,
metrics.py (Prometheus), middleware.py (API key, body limit, request counts), sse.py, errors.py,
config.py. Needs the `serve` extra (fastapi, uvicorn, prometheus-client).
"""

from specrt.serve.app import create_app, load_generators
from specrt.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app", "load_generators"]
