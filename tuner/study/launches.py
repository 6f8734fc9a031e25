"""From Optuna's next trial to its launch: the configuration it stands for, its refusal before launch where the
search space's rules or its KV cache rule it out, and the spec a worker runs (trace, load plan, rules)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from tuner.analysis.kv_budget import KvPrediction, estimate_kv
from tuner.search.kv_traffic import kv_traffic_bound, tpot_floor
from tuner.search.pruning import BoundaryWatch, VerdictWatch
from tuner.storage import StoredTrial, ValidationMark
from tuner.study.attrs import BASELINE_ATTR, KV_PREDICTION_ATTR, ON_DEFAULT_ATTR, VALIDATION_ATTR
from tuner.study.events import RunEvent, TrialStarted, TrialSummary
from tuner.study.heartbeat import Heartbeat
from tuner.study.ledger import InFlight, TrialLedger
from tuner.study.open_study import OpenStudy, kept_attrs, mark_of
from tuner.study.recommendation import candidates
from tuner.traces.records import Trace
from tuner.traces.selection import fit_trace
from tuner.workers.engine_config import EngineConfig
from tuner.workers.trial import TrialSpec


def _best_capacity(trials: list[StoredTrial]) -> tuple[float | None, float | None]:
    """The highest capacity among the candidate search trials (`candidates`; the feasible ones, as a search that
    starts from it runs only once one carried your traffic): (against the reference load, req/s)."""
    capacities = [t.scored.capacity for t in candidates(trials) if t.scored is not None]
    found = [(c.factor, c.rps) for c in capacities if c is not None and c.factor is not None]
    return max(found, default=(None, None))


class TrialLaunches:
    """Asks Optuna for the next trial and makes it a launch on a slot, or refuses it before launch (`ledger`)."""

    def __init__(self, opened: OpenStudy, ledger: TrialLedger, prune: bool, emit: Callable[[RunEvent], None]):
        self.opened, self.ledger, self.prune, self._emit = opened, ledger, prune, emit

    def config(self, trial: optuna.Trial) -> tuple[EngineConfig, bool]:
        """The configuration `trial` stands for, and whether it is vLLM's default (the baseline or its launches)."""
        mark = mark_of(trial)
        baseline = bool(trial.user_attrs.get(BASELINE_ATTR)) or (mark is not None and mark.default)
        space = self.opened.ctx.space
        return (space.baseline() if baseline else space.suggest(trial, only=trial.user_attrs.get(ON_DEFAULT_ATTR))), \
            baseline

    def queue(self, mark: ValidationMark, of: FrozenTrial | None) -> None:
        """Queue one validation launch of search trial `of`'s configuration (vLLM's default where None)."""
        self.opened.study.enqueue_trial({} if of is None else dict(of.params),
                                        user_attrs={VALIDATION_ATTR: mark.to_dict(),
                                                    **({} if of is None else kept_attrs(of))},
                                        skip_if_exists=False)

    def start(self, slot: int) -> tuple[InFlight, TrialSpec] | TrialSummary:
        """The next trial as a launch on `slot`, its heartbeat begun; or its summary where it was refused before
        launch."""
        opened = self.opened
        ctx, settings = opened.ctx, opened.settings
        trial = opened.study.ask()
        config, baseline = self.config(trial)
        number = trial.number
        trial.set_user_attr("engine_config", config.to_dict())
        trial.set_user_attr("serve_command", config.serve_command(settings.model))
        self._emit(TrialStarted(number, baseline, config, slot, time.time()))
        violations = ctx.space.violations(config, ctx.space_context)
        if violations:
            return self.ledger.infeasible(trial, config, baseline, violations)
        max_model_len = config.max_model_len or ctx.space_context.model_max_len
        self._record_prediction(trial, config, max_model_len)
        trace = fit_trace(ctx.trace, ctx.selection, max_model_len)
        # The baseline and every validation launch run to the end and search their whole capacity (below your
        # traffic too, never cut short by the best so far): gains are measured against them and between them.
        # While no configuration carries your traffic, every trial searches its whole capacity below it too
        # (unpruned: its first probe is expected to fail), to find which carries the most of it.
        trials = opened.trials()
        mark = mark_of(trial)
        whole = baseline or mark is not None or not self._carried_yet(trials)
        best = (None, None) if whole else _best_capacity(trials)
        # A search trial that cannot carry the best so far's traffic by its KV cache is not launched.
        if not baseline and mark is None and (short := self._short_of_best(config, trace, trials)) is not None:
            return self.ledger.infeasible(trial, config, baseline, [short])
        # A validation launch starts its search where its configuration's capacity was found: most settle their
        # bracket in two probes after the reference, instead of climbing to it again.
        start = self._earlier_capacity(trials, mark) if mark is not None else None
        # A re-run of a trial cut off goes on after the probes that one finished.
        rerun_of = opened.rerun_of(trial)
        resume = None if rerun_of is None else opened.probe_log(rerun_of).read(rerun_of, config)
        spec = TrialSpec(Path(settings.model), trace, config, opened.trial_dir(number),
                         startup_timeout_s=settings.startup_timeout_s,
                         request_timeout_s=settings.request_timeout_s,
                         stop_rule=BoundaryWatch(ctx.boundary) if self.prune and not whole else None,
                         # Every probe of a search, the baseline's and validation's too, ends once its verdict is
                         # a certain failure: an overloaded probe does not wait for every request.
                         verdict_rule=VerdictWatch(ctx.boundary) if settings.load.mode == "search" else None,
                         load=settings.load.for_launch(mark is not None).plan(
                             ctx.boundary, best_factor=best[0], below_reference=whole, start_factor=start),
                         resume=resume)
        # If this driver dies, the heartbeats stop and the next driver re-runs this configuration.
        beat = Heartbeat(opened.storage, trial._trial_id, opened.plan.heartbeat_interval_s)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return InFlight(trial, config, baseline, trace, slot, beat, started_at, best), spec

    def _earlier_capacity(self, trials: list[StoredTrial], mark: ValidationMark) -> float | None:
        """The capacity (against the reference load) that a validation arm's configuration showed in the search:
        the trial it validates, or for vLLM's default the study's baseline trial. None where it carried none."""
        source = mark.of_trial if mark.of_trial is not None else min(self.opened.baselines(), default=None)
        found = next((t for t in trials if t.trial_number == source), None)
        capacity = found.scored.capacity if found is not None and found.scored is not None else None
        return capacity.factor if capacity is not None else None

    def _short_of_best(self, config: EngineConfig, trace: Trace, trials: list[StoredTrial]) -> str | None:
        """Why `config`'s KV cache cannot carry the traffic the best search trial so far carries whole
        (`tuner.search.kv_traffic`); None where it might, or where nothing measured yet bounds it."""
        best = max((t.scored.carried_rps for t in candidates(trials)
                    if t.scored is not None and t.scored.capacity is not None), default=None)
        model, device = self.opened.ctx.space_context.model_memory, self.opened.ctx.space_context.device
        if best is None or model is None or device is None:
            return None
        measured = [(t.engine_config, m) for t in trials
                    for m in (t.measurement, *(j.probe.measurement for j in t.probes)) if m is not None]
        floor = tpot_floor(measured, config)
        bound = None if floor is None else kv_traffic_bound(estimate_kv(model, device, config), trace, floor, config)
        return bound.reason(best) if bound is not None and bound.rps < best else None

    def _carried_yet(self, trials: list[StoredTrial]) -> bool:
        """Whether some search trial carried your traffic within the boundary, or none was scored yet (the first
        trials search as if one had). False only in a load search where every scored trial broke the boundary
        at your traffic."""
        if self.opened.settings.load.mode != "search":
            return True
        scored = [t for t in trials if t.scored is not None and t.validation is None]
        return not scored or any(t.feasible for t in scored)

    def _record_prediction(self, trial: optuna.Trial, config: EngineConfig, max_model_len: int) -> None:
        """The KV cache expected of a configuration that is launched (near the margin or not), so that the real
        outcome is recorded beside it."""
        space_context = self.opened.ctx.space_context
        if space_context.model_memory is None or space_context.device is None:
            return
        estimate = estimate_kv(space_context.model_memory, space_context.device, config)
        trial.set_user_attr(KV_PREDICTION_ATTR,
                            KvPrediction(estimate, max_model_len, estimate.fit(max_model_len)).to_dict())
