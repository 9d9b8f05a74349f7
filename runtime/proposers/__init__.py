"""Drafting methods, one file each: draft_model.py, ngram.py, medusa.py (protocol in base.py)."""

from specrt.runtime.proposers.base import Proposal, Proposer
from specrt.runtime.proposers.draft_model import DraftModelProposer

__all__ = ["DraftModelProposer", "Proposal", "Proposer"]
