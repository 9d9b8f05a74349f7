"""`auto`'s k policy: the loop's k is only the node cap; the proposer (auto.py) sizes the tree from the shared cost
model, which `SizingPolicy.update` feeds with the measured pass and proposer times."""

from __future__ import annotations

from specrt.runtime.proposers.auto import AutoState, state_for


class SizingPolicy:
    """The `KPolicy` of `auto` (runtime/policy.py's protocol): the loop's k is only the node cap (the compiled
    maximum, clamped by the loop near the end); the proposer sizes the tree. `update` feeds the measured pass and
    proposer times to the shared cost model."""

    def __init__(self, state: AutoState, max_k: int) -> None:
        self.state, self.max_k = state, max_k

    def next_k(self) -> int:
        return self.max_k

    @property
    def current_k(self) -> int:
        return self.state.last_nodes

    def update(self, k: int, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.state.costs.observe(drafted + 1, verify_s, draft_s - self.state.draft_s)

    def off_reason(self) -> str:
        if self.state.plain_steps < 2:
            return ""
        return ("speculation off: no tree of drafts is predicted to beat plain decoding here (running acceptance "
                "against the measured cost of a pass per size); candidates are still scored every step")


def auto_policy(gen, k, seeded: bool):
    """`auto`'s policy: an integer k caps the tree's nodes; "auto" the compiled maximum (seeded sampling: the
    proposer's own fixed costs size it, nothing is timed)."""
    from specrt.runtime.policy import FixedK

    if k != "auto":
        return FixedK(min(int(k), gen.max_draft_tokens))
    if seeded:
        return FixedK(gen.max_draft_tokens)
    return SizingPolicy(state_for(gen), gen.max_draft_tokens)
