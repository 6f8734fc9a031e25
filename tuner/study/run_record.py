"""A run as stored while it goes: begun when its first pool is up, its end moved on and its trials added as they
end, so that a run that dies keeps what it held until its last trial."""

from __future__ import annotations

import dataclasses
import time

from tuner.storage.records import StoredRun
from tuner.storage.spend import Spend, slot_unit
from tuner.study.budget import RunBudget
from tuner.study.open_study import OpenStudy


class RunRecorder:
    """Keeps one runner's run stored (its search and its validation are one run), and the slots it holds."""

    def __init__(self, opened: OpenStudy, slots: int):
        self.opened = opened
        self.slots = slots
        self._run: StoredRun | None = None

    def record(self, started_at: float | None = None, gpus_per_slot: int = 0, budget: RunBudget | None = None,
               trial: int | None = None) -> None:
        """Store the run: begun (`started_at`) when its first pool is up, then its end moved on and `trial` added."""
        now = time.time()
        if self._run is None:
            if started_at is None:
                return
            self._run = StoredRun(self.opened.settings.name, started_at, now, self.slots, gpus_per_slot,
                                  budget_s=budget.budget_s if budget else None)
        trials = self._run.trials + ((trial,) if trial is not None and trial not in self._run.trials else ())
        self._run = self.opened.repo.save_run(dataclasses.replace(self._run, ended_at=now, trials=trials,
                                                                  slots=max(self._run.slots, self.slots)))

    def spent(self) -> Spend | None:
        """What the run has spent so far (None before its pool was up)."""
        if self._run is None:
            return None
        mine = [t for t in self.opened.trials() if t.trial_number in self._run.trials]
        return Spend.of(mine, [self._run])

    def unit(self) -> str:
        """What one of the run's slot-seconds is (`slot_unit`)."""
        return slot_unit(self._run.gpus_per_slot if self._run else 0)
