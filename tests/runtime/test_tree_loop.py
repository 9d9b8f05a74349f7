"""Greedy decoding with a token-tree proposer through the loop (runtime/loop.py) equals plain decoding on the toy
bundle, on every CPU backend, with tree passes that accept off the first chain and reject; a runner without the
tree input verifies the first chain and still decodes the same tokens."""

import numpy as np
import pytest

from specrt.runtime import load
from specrt.runtime.loop import decode
from specrt.runtime.policy import FixedK
from specrt.runtime.proposers.base import Proposal
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import GenerationStats
from specrt.runtime.tree import first_chain

NEW = 40


class OracleTree:
    """Drafts a random tree of k nodes whose one random branch carries the target's true continuation (known
    from a plain run) and whose other nodes are random tokens."""

    name = "oracle-tree"

    def __init__(self, reference: list[int], vocab: int, seed: int) -> None:
        self.reference, self.vocab = reference, vocab
        self.rng = np.random.default_rng(seed)
        self.trees = self.off_first_chain = 0
        self.verified: list[tuple[int, int, bool]] = []  # (rows fed, logits rows, a tree) per observe_verify

    def start(self, tokens, n, target_hidden=None):
        pass

    def propose(self, tokens, n, k):
        rng = self.rng
        parents = np.array([rng.integers(-1, i) if i else -1 for i in range(k)], np.int64)
        ids = rng.integers(0, self.vocab, k).astype(np.int64)
        node = int(rng.integers(0, k))
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(int(parents[path[-1]]))
        path.reverse()
        for depth, i in enumerate(path):
            if n + depth < len(self.reference):
                ids[i] = self.reference[n + depth]
        self.trees += 1
        self.off_first_chain += first_chain(parents).tolist()[:len(path)] != path
        return Proposal.point_mass(ids, parents=parents)

    def observe(self, n, num_accepted, target_hidden=None):
        pass

    def observe_verify(self, fed_ids, logits, parents):
        assert parents is None or parents.size == fed_ids.size - 1
        self.verified.append((fed_ids.size, logits.shape[0], parents is not None))


def run(gen, proposer, prompt, k=4):
    stats = GenerationStats()
    out = []
    for step in decode(gen.target, proposer, FixedK(k) if proposer else None, prompt, max_new_tokens=NEW,
                       max_draft_tokens=gen.max_draft_tokens, params=SamplingParams(), rng=np.random.default_rng(0),
                       eos_ids=frozenset(), stats=stats):
        out += step
    return out, stats


@pytest.mark.parametrize("backend", ("ort", "ort-portable", "torch"))
def test_greedy_tree_decoding_equals_plain(target_only_bundle, backend):
    gen = load(target_only_bundle, backend=backend, threads=1)
    assert gen.target.supports_tree
    prompt = np.array(gen.tokenizer.encode("def main(argv):\n    return"), np.int64)
    plain, _ = run(gen, None, prompt)
    oracle = OracleTree(prompt.tolist() + plain, gen.vocab_size, seed=1)
    got, stats = run(gen, oracle, prompt)
    assert got == plain
    assert oracle.trees > 3 and oracle.off_first_chain > 0  # branches other than the first one were verified
    assert stats.mean_accepted_tokens > 1.5
    assert stats.accepted_tokens < stats.drafted_tokens  # tree nodes were rejected too
    assert all(rows == fed for fed, rows, _ in oracle.verified) and sum(tree for *_, tree in oracle.verified) > 3


def test_runner_without_trees_verifies_the_first_chain(target_only_bundle):
    gen = load(target_only_bundle, backend="ort", threads=1)
    prompt = np.array(gen.tokenizer.encode("import json\nimport"), np.int64)
    plain, _ = run(gen, None, prompt)
    gen.target.supports_tree = False  # as a bundle compiled before token trees
    oracle = OracleTree(prompt.tolist() + plain, gen.vocab_size, seed=2)
    got, stats = run(gen, oracle, prompt)
    assert got == plain and stats.accepted_tokens > 0
    assert oracle.verified and not any(tree for *_, tree in oracle.verified)  # chains only reached the runner
