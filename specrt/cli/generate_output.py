"""The lines `specrt generate` prints on stderr after the text: the stats line (the same for --stream
and not) and the warning when the output stopped at the bundle's context."""

from __future__ import annotations


def stats_line(s) -> str:
    """One line; every figure says what it counts, so none contradicts another: the run's acceptance is given
    with its counts (or 'no tokens drafted'), the k is the last step's, and the adaptive controller's own
    figures (when it turned speculation off) are labelled as its estimates."""
    k = f"k={s.num_speculative_tokens}"
    if s.method != "none" and s.num_speculative_tokens == 0 and s.speculation_note:
        k = f"k=0 at the end ({s.speculation_note})"
    return (f"[{s.method}, {k}, {s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, "
            f"{acceptance_text(s.drafted_tokens, s.accepted_tokens)}"
            f"{f'mean accepted {s.mean_accepted_tokens:.2f}, ' if s.drafted_tokens else ''}"
            f"{branches_text(s.branches)}{constraint_text(s)}finish_reason {s.finish_reason}, backend {s.backend}]")


def constraint_text(s) -> str:
    """'constraint json_schema, forced 12/14 accepted, ' for a constrained run, else ''."""
    if not s.constraint:
        return ""
    return f"constraint {s.constraint.split(':')[0]}, forced {s.forced_accepted}/{s.forced_tokens} accepted, "


def acceptance_text(drafted: int, accepted: int, tail: str = ", ") -> str:
    """'acceptance 0.75 (6/8 drafted tokens), ' or 'no tokens drafted, '."""
    if not drafted:
        return f"no tokens drafted{tail}"
    return f"acceptance {accepted / drafted:.2f} ({accepted}/{drafted} drafted tokens){tail}"


def branches_text(branches: dict) -> str:
    """'ngram 12 steps (acceptance 0.80 (8/10 drafted tokens)), draft 5 steps (no tokens drafted), ' for a
    hybrid run (every branch that proposed, with its own counts), else ''."""
    parts = [f"{name} {b['steps']} steps ({acceptance_text(b['drafted'], b['accepted'], '')})"
             for name, b in branches.items() if b.get("steps")]
    return "".join(f"{part}, " for part in parts)


def context_warning(s, max_new_tokens: int, max_seq_len: int) -> str | None:
    """None unless prompt + max_new_tokens exceeded the context and the output stopped there."""
    if not s.context_limited or s.finish_reason != "length" or s.new_tokens >= max_new_tokens:
        return None
    return (f"warning: stopped at the bundle's context of {max_seq_len} tokens: {s.new_tokens} of "
            f"--max-new-tokens {max_new_tokens} generated after a {s.prompt_tokens}-token prompt "
            "(finish_reason length; --strict makes this an error)")
