"""Choose k per request each step to maximise the batch's goodput (expected tokens per second).

A step is made of passes of two kinds (scheduler.py):
* a request that speculates with k drafts runs one pass over its pending token and the k drafts in its own region
  (`T_rows(k + 1)`, exactly the single-sequence verify) plus its drafting (`k * c_draft`), and gains
  1 + a + a^2 + ... + a^k expected tokens at per-token acceptance a;
* one batched one-token pass over every decoding request (`T_batch(B)`, measured per B) gives each request one more
  token (a request that speculated first feeds its newly picked token).
Two families of passes (family.py): **fused**, with a **batched** plan (the batched pass runs: each request k >= 0,
speculating ones gain one token more) or a **separate** one (no batched pass: every request runs its own pass,
k >= 0; at B = 1 this is the single-sequence loop), and **packed** (ONE pass of the packed graph over every request's
pending token and drafts, each in its own region: `T_packed(b, rows)`; runtime/batch/packed.py). The packed family is
planned greedily: starting from k = 0 everywhere, add the draft with the most expected tokens per extra second while
it raises the step's goodput (its cost is not separable: a row's price depends on the pass's total rows).
Within a plan goodput G = tokens / seconds is a separable fractional programme: Dinkelbach's iteration (pick each
k maximising tokens_i - G * seconds_i, update G) reaches its optimum in a few rounds. The fused plan with the larger
optimum wins; ties go to the batched one, whose all-zero choice is plain batched decoding, so the choice is never
predicted below it.
"""

from __future__ import annotations

import dataclasses


SPEC_MARGIN = 1.05


@dataclasses.dataclass
class CostTable:
    batch: list[float]  # batch[b - 1]: seconds of one batched decode pass of b sequences
    rows: list[float]  # rows[s - 1]: seconds of one single-sequence pass of s tokens
    draft_token: float = 0.0  # seconds per drafted token (0 for n-gram)
    # packed[i][j]: seconds of one packed pass of packed_b[i] sequences with packed_r[j] rows each (empty: none)
    packed: list[list[float]] = dataclasses.field(default_factory=list)
    packed_b: list[int] = dataclasses.field(default_factory=list)
    packed_r: list[int] = dataclasses.field(default_factory=list)

    def t_batch(self, b: int) -> float:
        return self.batch[min(b, len(self.batch)) - 1]

    def t_rows(self, s: int) -> float:
        return self.rows[min(s, len(self.rows)) - 1]

    def t_packed(self, b: int, rows: int) -> float:
        """Seconds of a packed pass of b sequences and `rows` rows in all (interpolated in the measured grid,
        extrapolated linearly beyond it)."""
        per = rows / b
        by_b = [_interp(self.packed_r, line, per) for line in self.packed]
        return _interp(self.packed_b, by_b, b)


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if x > xs[0] else 1.0)
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclasses.dataclass(frozen=True)
class KPlan:
    """A step's k per request and the passes they imply, with the goodput predicted for them."""

    ks: list[int]  # drafts per request (0: no speculation this step)
    batched: bool  # the batched one-token pass runs (False: every request runs its own pass)
    goodput: float  # expected tokens per second of the plan
    packed: bool = False  # one packed pass over every request (batched is then False)


def gain(a: float, k: int) -> float:
    """Expected extra tokens of k drafts at per-token acceptance a: a + a^2 + ... + a^k."""
    return sum(a ** i for i in range(1, k + 1))


def _dinkelbach(options: list[list[tuple[int, float, float]]], fixed_tokens: float, fixed_s: float,
                rounds: int = 6) -> tuple[list[int], float]:
    """options[i]: (k, tokens, seconds) candidates of request i. Maximise (fixed_tokens + sum tokens) /
    (fixed_s + sum seconds) over one candidate per request -> (ks, goodput)."""
    pick = [opts[0] for opts in options]
    tokens = fixed_tokens + sum(p[1] for p in pick)
    secs = fixed_s + sum(p[2] for p in pick)
    g = tokens / secs if secs > 0 else 0.0
    for _ in range(rounds):
        new = [max(opts, key=lambda o: (o[1] - g * o[2], -o[0])) for opts in options]
        if new == pick:
            break
        tokens = fixed_tokens + sum(p[1] for p in new)
        secs = fixed_s + sum(p[2] for p in new)
        g_new = tokens / secs if secs > 0 else 0.0
        if g_new <= g:  # Dinkelbach never decreases G; equal means converged
            break
        pick, g = new, g_new
    return [p[0] for p in pick], g


def plan_packed(acceptance: list[float], max_ks: list[int], draft_costs: list[float], table: CostTable,
                gains: list | None = None) -> KPlan:
    """The packed family's plan: greedy over one more draft at a time (module docstring). `gains[i]`, where not
    None: request i's expected accepted drafts per draft count (a tree proposer's best chain, trees.py), in place of
    its per-token acceptance."""
    b = len(acceptance)
    ks = [0] * b
    rows = b
    tokens, secs = float(b), table.t_packed(b, rows)
    drafting = 0.0  # seconds of the drafts planned so far (in secs, not in the pass)
    while True:
        best = None
        # the pass with one row more, the same for every candidate: its extra seconds plus the draft's own
        extra_row = table.t_packed(b, rows + 1) - (secs - drafting)
        for i, (a, kmax, cd) in enumerate(zip(acceptance, max_ks, draft_costs)):
            if ks[i] >= kmax:
                continue
            g = gains[i] if gains is not None else None
            dt = a ** (ks[i] + 1) if g is None else g[ks[i] + 1] - g[ks[i]]
            if dt <= 0.0:
                continue
            ds = max(extra_row + cd, 1e-9) * SPEC_MARGIN
            if (tokens + dt) / (secs + ds) > tokens / secs and (best is None or dt * best[2] > best[1] * ds):
                best = (i, dt, ds)
        if best is None:
            break
        i, dt, ds = best
        ks[i] += 1
        rows += 1
        tokens += dt
        drafting += draft_costs[i]
        secs = table.t_packed(b, rows) + drafting
    return KPlan(ks, False, tokens / secs, packed=True)


def plan_step(acceptance: list[float], max_ks: list[int], draft_costs: list[float], table: CostTable,
              batched_ok: bool = True, gains: list | None = None) -> KPlan:
    """k per request (0 allowed) and the fused plan, batched or separate, maximising expected tokens / expected
    seconds of the step. `batched_ok` False: no one-token batched pass (a target whose one-token calls must run
    as several rows). The packed family is planned by `plan_packed` (family.py chooses between them). `gains[i]`,
    where not None: request i's expected accepted drafts per node count (a tree of k nodes, verified in a pass of
    k + 1 rows priced `t_rows(k + 1)`: trees.py), in place of the chain's a + a^2 + ... + a^k."""
    b = len(acceptance)
    if b == 0:
        return KPlan([], batched_ok, 0.0)

    def spec(a: float, k: int, cd: float, g) -> tuple[float, float]:
        # a drafting pass is charged SPEC_MARGIN more: speculation must beat not drafting by that much (estimates
        # are noisy; the single-sequence loop's adaptive k asks the same 5%)
        return 1.0 + (gain(a, k) if g is None else g[k]), (k * cd + table.t_rows(k + 1)) * (SPEC_MARGIN if k else 1.0)

    batched_opts, separate_opts = [], []
    for i, (a, kmax, cd) in enumerate(zip(acceptance, max_ks, draft_costs)):
        g = gains[i] if gains is not None else None
        batched_opts.append([(0, 0.0, 0.0)] + [(k, *spec(a, k, cd, g)) for k in range(1, kmax + 1)])
        separate_opts.append([(k, *spec(a, k, cd, g)) for k in range(0, kmax + 1)])
    ks, g = _dinkelbach(separate_opts, 0.0, 0.0)
    best = KPlan(ks, False, g)
    if batched_ok:
        ks, g = _dinkelbach(batched_opts, float(b), table.t_batch(b))
        if g >= best.goodput:
            best = KPlan(ks, True, g)
    return best


def choose_ks(acceptance: list[float], max_ks: list[int], greedy: list[bool], draft_costs: list[float],
              table: CostTable) -> list[int]:
    """k per request of the best plan (kept for callers that only need the ks)."""
    del greedy  # a speculating request's pass runs whatever the first draft's fate
    return plan_step(acceptance, max_ks, draft_costs, table).ks
