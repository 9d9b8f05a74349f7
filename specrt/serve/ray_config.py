"""Settings of `specrt serve --ray` (frozen, validated on construction). Imports no Ray.

    config = RayConfig(min_replicas=1, max_replicas=4, cpus_per_replica=2)
    config.deployment_options(slots=2, max_queue=64)   # -> keyword arguments of @serve.deployment
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from specrt.core.errors import InvalidArgument

APP_NAME = "specrt"  # the Ray Serve application and deployment name
LOAD_ATTEMPTS = 3  # replica constructor attempts before the deployment is reported as failed
GRACEFUL_SHUTDOWN_S = 30.0  # as `specrt serve`: running requests get this long to finish


@dataclasses.dataclass(frozen=True)
class RayConfig:
    replicas: Optional[int] = None  # a fixed number of replicas (default 1 when no min/max is given)
    min_replicas: Optional[int] = None  # autoscaling bounds (both or neither)
    max_replicas: Optional[int] = None
    address: Optional[str] = None  # a running cluster ("auto", "HOST:6379"); None: start a local Ray instance
    cpus_per_replica: float = 1.0  # Ray CPU resources reserved by each replica
    target_ongoing_requests: Optional[float] = None  # autoscaling target per replica (default: its slots)
    app_name: str = APP_NAME

    def __post_init__(self) -> None:
        fixed, lo, hi = self.replicas, self.min_replicas, self.max_replicas
        if fixed is not None and (lo is not None or hi is not None):
            raise InvalidArgument("give either --replicas or --min-replicas/--max-replicas, not both")
        if (lo is None) != (hi is None):
            raise InvalidArgument("autoscaling needs both --min-replicas and --max-replicas")
        if fixed is not None and fixed < 1:
            raise InvalidArgument(f"replicas must be >= 1, got {fixed}")
        if lo is not None and (lo < 1 or hi < lo):
            raise InvalidArgument(f"need 1 <= min_replicas <= max_replicas, got {lo} and {hi}")
        if not (self.cpus_per_replica > 0 and math.isfinite(self.cpus_per_replica)):
            raise InvalidArgument(f"cpus_per_replica must be > 0, got {self.cpus_per_replica}")
        if self.target_ongoing_requests is not None and not self.target_ongoing_requests > 0:
            raise InvalidArgument(f"target_ongoing_requests must be > 0, got {self.target_ongoing_requests}")
        if not self.app_name:
            raise InvalidArgument("app_name must not be empty")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None

    @property
    def initial_replicas(self) -> int:
        return self.min_replicas if self.autoscaling else (self.replicas or 1)

    def threads_per_replica(self, threads: Optional[int] = None) -> int:
        """CPU threads a replica's runners use in all: --threads, else its CPU reservation rounded up."""
        return threads or max(1, math.ceil(self.cpus_per_replica))

    def deployment_options(self, slots: int, max_queue: int) -> dict[str, Any]:
        """@serve.deployment options; autoscaling aims at `slots` ongoing requests per replica.

        Ray routes at most `max_ongoing_requests` to a replica and holds the rest in its proxy. One more than
        a replica's slots plus queue lets the replica itself answer 429 when its queue is full, as
        `specrt serve` does, instead of requests piling up unbounded in the proxy."""
        options: dict[str, Any] = {
            "name": self.app_name,
            "ray_actor_options": {"num_cpus": self.cpus_per_replica},
            "max_ongoing_requests": slots + max_queue + 1,
            "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_S,
            "max_constructor_retry_count": LOAD_ATTEMPTS,
        }
        if self.autoscaling:
            options["autoscaling_config"] = {
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": self.min_replicas,
                "target_ongoing_requests": self.target_ongoing_requests or slots,
            }
        else:
            options["num_replicas"] = self.initial_replicas
        return options
