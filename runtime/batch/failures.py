"""One request's failure ends that request, not the batch (docs/safety.md §4).

A step runs every request's proposer (the plan: free proposals, tree offers, proposals; the passes: the successor
table's refresh, commit's `observe`; a finished prefill: `start`) and its own passes (a verify, a prompt chunk).
`guarded(seq, fn, *args)` runs one request's part: an Exception there is recorded on the request (`seq.error`,
finished "error") and the step goes on without it; at retirement the scheduler frees its region and ends it with that
error (its caller's iterator raises it; the server answers that one request with 500). A failure that belongs to no
one request (a packed or batched pass over all of them) still ends every request in the step, and the engine serves
on.
"""

from __future__ import annotations

import logging

log = logging.getLogger("specrt.batch")


def guarded(seq, fn, *args, default=None):
    """fn(*args) for `seq`'s part of a step; `default` when it raised (the request then failed) or had failed."""
    if seq.error is not None:
        return default
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - ends this request only
        fail(seq, exc)
        return default


def fail(seq, exc: BaseException) -> None:
    """`seq` failed: it takes no further part in the step and ends with `exc` at retirement."""
    log.warning("request %s failed in the batch: %s: %s", seq.request_id, type(exc).__name__, exc)
    seq.error = exc
    seq.finished = seq.stats.finish_reason = "error"
