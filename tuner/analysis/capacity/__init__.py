"""How much of the trace's traffic a configuration carries within its boundary.

A trial probes its engine at several loads (tuner.workers.probes). Here each probe is judged (`judge_probe`:
pass, fail or inconclusive, with the reasons), the next probe's load is chosen so as to bracket and bisect the
highest load that passes (`LoadSearch`), and the probes of a trial are summed up as its capacity (`Capacity`).

A probe passes when the boundary holds *and* the engine kept up with the arrivals: a load that grows a queue a
longer run would never drain fails even when its percentiles look fine. A percentile decision within noise (the
95% interval of the share of requests meeting a limit holds the boundary's 0.95) is inconclusive, and so is a
probe too short for its own latencies to show the pace (`scoring.pace_undecided`); the search treats an
inconclusive probe as the bracket's upper edge and says so.
"""

from tuner.analysis.capacity.search import (LOAD_MODES, SETTLED_FROM_START, LoadPolicy, LoadSearch, ProbeLength,
                                            bracket, capacity_of, served_alone)
from tuner.analysis.capacity.verdict import (DECISIVE_REQUESTS, PERCENTILE, PERCENTILE_LIMITS, WILSON_Z, JudgedProbe,
                                    ProbeJudgement, Verdict, judge_probe, wilson_interval)

__all__ = ["DECISIVE_REQUESTS", "LOAD_MODES", "PERCENTILE", "PERCENTILE_LIMITS", "SETTLED_FROM_START", "WILSON_Z",
           "JudgedProbe", "LoadPolicy", "LoadSearch", "ProbeJudgement", "ProbeLength", "Verdict", "bracket",
           "capacity_of", "judge_probe", "served_alone", "wilson_interval"]
