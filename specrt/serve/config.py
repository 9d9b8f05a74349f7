"""Server settings, validated on construction (frozen: one per app)."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Union

from specrt.core.errors import InvalidArgument
from specrt.runtime.request import DEFAULT_K, METHODS, parse_k

API_KEY_ENV = "SPECRT_API_KEY"


def api_key_from(option: Optional[str], environ: Mapping[str, str]) -> Optional[str]:
    """The server's API key: `--api-key`, else SPECRT_API_KEY. A variable that is set but blank is refused
    (it would otherwise serve without authentication and without a word)."""
    if option is not None:
        return option
    value = environ.get(API_KEY_ENV)
    if value is not None and not value.strip():
        raise InvalidArgument(f"{API_KEY_ENV} is set but empty: set a key, or unset it to serve without one")
    return value


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    served_model_name: str
    api_key: Optional[str] = None
    max_queue: int = 64  # requests waiting for a slot before 429
    method: Optional[str] = None  # default drafting method (None: the bundle's default)
    num_speculative_tokens: Union[int, str] = DEFAULT_K  # default k per request
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise InvalidArgument("served_model_name must not be empty")
        if self.max_queue < 0:
            raise InvalidArgument(f"max_queue must be >= 0, got {self.max_queue}")
        if self.method is not None and self.method not in METHODS:
            raise InvalidArgument(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        object.__setattr__(self, "num_speculative_tokens", parse_k(self.num_speculative_tokens))
        if self.max_body_bytes < 1024:
            raise InvalidArgument(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.api_key is not None and not self.api_key.strip():
            raise InvalidArgument("api_key must not be blank")
