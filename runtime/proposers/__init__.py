"""Drafting methods, one file each: draft_model.py, ngram.py, medusa.py (protocol in base.py)."""

from .base import Proposal, Proposer
from .draft_model import DraftModelProposer

__all__ = ["DraftModelProposer", "Proposal", "Proposer"]
