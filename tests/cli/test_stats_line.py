"""The `generate` stats line never contradicts itself: acceptance comes with its counts or 'no tokens drafted',
the controller's own estimates are labelled, and a hybrid run shows each branch that proposed."""

from specrt.cli.generate_output import stats_line
from specrt.runtime.stats import GenerationStats


def stats(**kw):
    base = dict(method="draft", backend="ort", new_tokens=8, elapsed_s=1.0, finish_reason="length")
    return GenerationStats(**(base | kw))


def test_speculation_off_without_drafts_shows_no_acceptance():
    line = stats_line(stats(num_speculative_tokens=0, verify_steps=0,
                            speculation_note="speculation off: drafting is slower than plain decoding here, by "
                                             "the controller's estimates (per-token acceptance 0.45, ...)"))
    assert "no tokens drafted" in line
    assert "acceptance 0.00" not in line and "acceptance 1.00" not in line and "mean accepted" not in line
    assert "k=0 at the end (speculation off" in line


def test_speculation_off_after_probes_gives_the_counts():
    line = stats_line(stats(num_speculative_tokens=0, drafted_tokens=4, accepted_tokens=4, verify_steps=2,
                            speculation_note="speculation off: ..."))
    assert "k=0 at the end (speculation off: ...)" in line
    assert "acceptance 1.00 (4/4 drafted tokens), mean accepted 3.00" in line


def test_plain_decoding_says_nothing_was_drafted():
    line = stats_line(stats(method="none"))
    assert line.startswith("[none, k=0, 8 tokens") and "no tokens drafted" in line


def test_hybrid_shows_each_branch_with_its_own_counts():
    line = stats_line(stats(method="hybrid", num_speculative_tokens=4, drafted_tokens=12, accepted_tokens=6,
                            verify_steps=5, branches={"ngram": {"steps": 3, "drafted": 8, "accepted": 6},
                                                      "draft": {"steps": 2, "drafted": 4, "accepted": 0},
                                                      "medusa": {"steps": 0, "drafted": 0, "accepted": 0}}))
    assert "acceptance 0.50 (6/12 drafted tokens)" in line
    assert "ngram 3 steps (acceptance 0.75 (6/8 drafted tokens))" in line
    assert "draft 2 steps (acceptance 0.00 (0/4 drafted tokens))" in line
    assert "medusa" not in line
