"""`Tolerance`: the ONNX-vs-PyTorch bound of every compile-time validation (validate.py explains the defaults).

No torch here: `CompileSpec` (spec.py) holds one, and building a spec loads nothing heavy."""

from __future__ import annotations

import dataclasses

import numpy as np

from specrt.core.errors import InvalidArgument


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Per tensor: max |diff| <= atol + rtol * max |reference|."""

    atol: float = 1e-4
    rtol: float = 1e-3

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise InvalidArgument(f"tolerance {name} must be a finite number >= 0, got {value!r}")

    @classmethod
    def parse(cls, text: str) -> "Tolerance":
        """'ATOL,RTOL' (e.g. '1e-4,1e-3') as given to `compile --tolerance`."""
        parts = text.split(",")
        try:
            if len(parts) != 2:
                raise ValueError
            return cls(float(parts[0]), float(parts[1]))
        except ValueError:
            raise InvalidArgument(
                f"--tolerance must be ATOL,RTOL (two numbers, e.g. 1e-4,1e-3), got {text!r}") from None

    def bound(self, scale: float) -> float:
        return self.atol + self.rtol * scale
