"""`--max-minutes` of a recipe as deadlines for the whole command (docs/draft-head.md "Time budget").

The budget starts when the command starts: loading (and converting) the target, making the data, training, the
held-out measure and saving all count. Making the data stops at its share of the budget, between two decoding
steps (an answer under way is kept, cut short; answers made by a bundle stop between two batches), and training
takes what is left but a reserve for the held-out measure and saving, which stop at the end of the budget.
Training given a number of steps (`--steps`) is not timed: it runs those steps.
"""

from __future__ import annotations

import time

RESERVE_SHARE, RESERVE_MAX_S = 0.05, 30.0  # kept after training for the held-out measure and saving
MIN_TRAIN_S = 3.0  # training's floor when the data took longer than its share (one decoding step can)


class Budget:
    def __init__(self, started: float, minutes: float | None, timed_training: bool = True) -> None:
        self.started = started
        self.minutes = minutes
        self.timed_training = timed_training
        self.end = None if minutes is None else started + minutes * 60.0  # time.time() deadline of the command

    def elapsed(self) -> float:
        return time.time() - self.started

    def data_deadline(self, share: float) -> float | None:
        """When making the data must stop: `share` of the budget after the start."""
        return None if self.minutes is None else self.started + share * self.minutes * 60.0

    def training_minutes(self) -> float | None:
        """Minutes left for timed training (None: not timed, it runs --steps)."""
        if self.end is None or not self.timed_training:
            return None
        reserve = min(RESERVE_MAX_S, RESERVE_SHARE * self.minutes * 60.0)
        return max(MIN_TRAIN_S, self.end - reserve - time.time()) / 60.0
