"""The lines `specrt generate` prints on stderr after the text: the stats line (the same for --stream
and not) and the warning when the output stopped at the bundle's context."""

from __future__ import annotations


def stats_line(s) -> str:
    k = f"k={s.num_speculative_tokens}"
    if s.method != "none" and s.num_speculative_tokens == 0 and s.speculation_note:
        k += f" ({s.speculation_note})"
    return (f"[{s.method}, {k}, {s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, "
            f"acceptance {s.acceptance_rate:.2f}, mean accepted {s.mean_accepted_tokens:.2f}, "
            f"{branches_text(s.branches)}{constraint_text(s)}finish_reason {s.finish_reason}, backend {s.backend}]")


def constraint_text(s) -> str:
    """'constraint json_schema, forced 12/14 accepted, ' for a constrained run, else ''."""
    if not s.constraint:
        return ""
    return f"constraint {s.constraint.split(':')[0]}, forced {s.forced_accepted}/{s.forced_tokens} accepted, "


def branches_text(branches: dict) -> str:
    """'ngram 12 steps (acceptance 0.80), draft 5 steps (acceptance 0.40), ' for a hybrid run, else ''."""
    parts = [f"{name} {b['steps']} steps (acceptance {b['accepted'] / b['drafted'] if b['drafted'] else 0.0:.2f})"
             for name, b in branches.items()]
    return "".join(f"{part}, " for part in parts)


def context_warning(s, max_new_tokens: int, max_seq_len: int) -> str | None:
    """None unless prompt + max_new_tokens exceeded the context and the output stopped there."""
    if not s.context_limited or s.finish_reason != "length" or s.new_tokens >= max_new_tokens:
        return None
    return (f"warning: stopped at the bundle's context of {max_seq_len} tokens: {s.new_tokens} of "
            f"--max-new-tokens {max_new_tokens} generated after a {s.prompt_tokens}-token prompt "
            "(finish_reason length; --strict makes this an error)")
