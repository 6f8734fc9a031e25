"""A running trial's heartbeat, which the driver keeps itself: Optuna beats only inside study.optimize, and a run
asks and tells on its own (tuner/study/plan.py)."""

from __future__ import annotations

import threading

from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage


class Heartbeat:
    """Proves the driver alive for one running trial, as study.optimize would (ask/tell has no heartbeat)."""

    def __init__(self, storage: RDBStorage, trial_id: int, interval_s: float):
        self._storage, self._trial_id, self._interval = storage, trial_id, interval_s
        self._stop = threading.Event()
        storage.record_heartbeat(trial_id)
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except StorageInternalError:
                # The database is out of reach for now: beat again next time. Whether the run can go on is
                # decided when the trial's result is stored.
                continue

    def stop(self) -> None:
        """Beat no more: the trial ended, or its run did."""
        self._stop.set()
        self._thread.join()
