"""Typed errors. Every error a user can cause carries a message that names the bad value and the fix.

Exit codes used by the CLI: 2 for usage errors and bad input, 1 for runtime failures.
"""


class SpecrtError(Exception):
    """Base class of every error specrt raises on purpose."""

    exit_code = 1


class InvalidArgument(SpecrtError, ValueError):
    """A call argument or CLI option is out of range (temperature < 0, k above the compiled maximum...)."""

    exit_code = 2


class CheckpointError(SpecrtError):
    """A Hugging Face checkpoint directory cannot be used (missing files, unsupported architecture...)."""

    exit_code = 2


class BundleError(SpecrtError):
    """A compiled bundle is missing, corrupted, or does not match this machine."""

    exit_code = 2


class ChecksumMismatch(BundleError):
    """A bundle file's sha256 differs from the manifest."""


class VersionMismatch(BundleError):
    """A bundle or engine was built for another version / GPU than the one installed."""


class BackendUnavailable(SpecrtError):
    """The requested backend (TensorRT, CUDA provider...) is not installed or has no device."""

    exit_code = 1


class BackendError(SpecrtError):
    """A backend call failed at run time (native call returned failure)."""

    exit_code = 1


class ManifestError(BundleError):
    """A manifest value has the wrong type, is out of range, or disagrees with the bundle's graphs."""


class MissingDependency(SpecrtError):
    """An optional dependency (an extra) that this command needs is not installed; the message names the extra."""

    exit_code = 2


class EngineClosed(SpecrtError, RuntimeError):
    """A BatchEngine was closed: the requests it still held end with this error, later calls raise it at once."""


class GeneratorClosed(SpecrtError, RuntimeError):
    """A Generator (or one of its runners) was closed: load the bundle again."""


class GeneratorBusy(SpecrtError):
    """Kept for callers that catch it; no longer raised: a stream nobody reads no longer holds the Generator
    (runtime/exclusive.py)."""

    exit_code = 1
