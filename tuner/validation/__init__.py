"""Validation: vLLM's default configuration and a study's finalists launched again, R times each in interleaved
order, or on one GPU paired (one engine each, taking turns through vLLM's sleep mode), and the gain of the best
over the default stated with its 95% confidence interval.

A configuration measured once can look better by chance (the best of many noisy measurements is biased
upwards), so the recommendation of a validated study is the finalist with the best median over fresh launches,
and its gain over the default is the ratio of their geometric means with a t-interval on the log values: Welch's
for interleaved launches, the paired one on the rounds' log ratios for paired rounds. With few repeats the
interval is wide, as it should be. Each launch (or paired round of an arm) is a trial of the study marked with a
`ValidationMark`; this package reads those trials back and judges them. It needs no Ray and no engine.
"""

from tuner.validation.design import (DEFAULT_REPEATS, DEFAULT_TOP, PAIRED, Arm, Pairing, interleaved, paired_design,
                                     pairing)
from tuner.validation.intervals import CONFIDENCE, GainInterval, capacity_interval, gain_interval
from tuner.validation.verdict import (ArmResult, Validation, latest_validation, launch_bracket, launch_value,
                                      unstarted, validations)

__all__ = ["CONFIDENCE", "DEFAULT_REPEATS", "DEFAULT_TOP", "PAIRED", "Arm", "ArmResult", "GainInterval", "Pairing",
           "Validation", "capacity_interval", "gain_interval", "interleaved", "latest_validation", "launch_bracket",
           "launch_value", "paired_design", "pairing", "unstarted", "validations"]
