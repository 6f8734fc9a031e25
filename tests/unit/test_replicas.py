"""Replicas for a rate, by hand: ceil(rate / (capacity x headroom)) at each end of a capacity's interval, the
busiest window and the day's curve of a trace, and what the hours cost."""

from __future__ import annotations

import math

import pytest

from tuner.common.errors import TunerError
from tuner.analysis.replicas import (MeasuredCapacity, ReplicaCount, busiest_window, check_price, day_plan,
                                     hourly_rates, read_hourly_rates, replicas_for)
from tuner.validation import capacity_interval


def test_replicas_are_the_rate_over_the_capacity_used_rounded_up():
    once = MeasuredCapacity.once(10.0)
    assert replicas_for(100.0, once, 1.0) == ReplicaCount(10, 10)  # exactly 10 full replicas, not 11
    assert replicas_for(100.0, once, 0.8) == ReplicaCount(13, 13)  # 100 / 8 = 12.5
    assert replicas_for(80.0, once, 0.8).text() == "10 replicas"
    assert replicas_for(80.0, once, 0.8) == ReplicaCount(10, 10)  # 80 / (10 x 0.8) is 10 in floats too


def test_a_peak_below_one_replicas_capacity_needs_one_replica():
    assert replicas_for(0.5, MeasuredCapacity.once(10.0)) == ReplicaCount(1, 1)
    assert replicas_for(0.0, MeasuredCapacity.once(10.0)).text() == "1 replica"


def test_an_interval_gives_a_range_of_replicas():
    capacity = MeasuredCapacity(10.0, 9.0, 11.0, 3)
    count = replicas_for(80.0, capacity, 1.0)
    assert count == ReplicaCount(8, 9)  # 80 / 11 = 7.3 -> 8; 80 / 9 = 8.9 -> 9
    assert count.text() == "8 to 9 replicas"
    # No failing load above it: the capacity's high end is open, the fewest replicas is the one that always stays.
    assert replicas_for(80.0, MeasuredCapacity(10.0, 9.0, math.inf, 2), 1.0) == ReplicaCount(1, 9)


def test_a_capacity_states_its_launches_or_that_it_was_measured_once():
    assert MeasuredCapacity.once(8.1).text() == "8.1 req/s (measured once)"
    assert MeasuredCapacity(8.1, 7.6, 8.7, 3).text() == "8.1 req/s (95% CI 7.6-8.7, 3 launches)"


def test_the_capacity_interval_is_the_t_interval_on_the_logs_widened_to_the_resolution():
    values = [10.0, 12.0, 11.0]
    logs = [math.log(v) for v in values]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302653 * sd / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    capacity = capacity_interval(values)
    assert capacity.rps == pytest.approx(math.exp(mean))
    assert (capacity.low, capacity.high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-5)
    assert capacity.launches == 3
    # Launches that agree exactly (capacities on the search's grid): the search's precision is the interval.
    same = capacity_interval([16.3, 16.3], resolution=0.1, bracket=0.42)
    assert (same.rps, same.low, same.high) == pytest.approx((16.3, 16.3 / 1.1, 16.3 * 1.42))
    with pytest.raises(ValueError):
        capacity_interval([16.3])


def test_the_busiest_window_counts_the_most_arrivals_within_it():
    arrivals = [0.0, 1.0, 2.0, 30.0, 30.5, 31.0, 31.5, 32.0, 100.0]
    peak = busiest_window(arrivals, 5.0)
    assert (peak.rps, peak.start_s, peak.window_s) == (1.0, 30.0, 5.0)  # 5 arrivals in [30, 35)
    assert busiest_window(arrivals, 60.0).rps == pytest.approx(8 / 60)


def test_a_day_needs_a_trace_of_24_hours_and_folds_longer_ones_by_hour_of_day():
    assert hourly_rates([float(s) for s in range(0, 23 * 3600, 60)]) is None
    # 48 hours: hour h of day one at 1 request a minute, of day two at 3; the last request closes the span.
    arrivals = [h * 3600 + m * 60.0 for h in range(24) for m in range(60)]
    arrivals += [(24 + h) * 3600 + m * 20.0 for h in range(24) for m in range(180)] + [48 * 3600.0]
    rates = hourly_rates(arrivals)
    assert rates is not None and len(rates) == 24
    assert rates[0] == pytest.approx((60 + 180) / 2 / 3600)


def test_a_day_plan_sums_replicas_into_slot_hours_and_prices_them():
    rates = [8.0] * 12 + [16.0] * 12  # req/s
    plan = day_plan(rates, MeasuredCapacity.once(10.0), 0.8, 2, 2.5, 100.0)
    assert [r.low for r in plan.replicas] == [1] * 12 + [2] * 12
    assert plan.slot_hours == (72.0, 72.0)  # (12 x 1 + 12 x 2) replicas x 2 GPUs each
    assert plan.cost_usd == (180.0, 180.0)
    tokens = (8 * 12 + 16 * 12) * 3600 * 100.0
    assert plan.cost_per_million_tokens_usd == pytest.approx((180 / (tokens / 1e6),) * 2)
    unpriced = day_plan(rates, MeasuredCapacity.once(10.0), 0.8, 1, None, 100.0)
    assert unpriced.cost_usd is None and unpriced.cost_per_million_tokens_usd is None


@pytest.mark.parametrize("price", [0.0, -1.5])
def test_a_zero_or_negative_price_is_refused(price):
    with pytest.raises(TunerError, match="--gpu-hour-cost must be above 0"):
        check_price(price)
    with pytest.raises(TunerError, match="--gpu-hour-cost"):
        day_plan([1.0] * 24, MeasuredCapacity.once(1.0), 0.8, 1, price, 10.0)


def test_a_days_rates_file_is_read_with_clear_errors():
    text = "hour,rps\n" + "".join(f"{h},{h / 2}\n" for h in range(24))
    assert read_hourly_rates("day.csv", text)[3] == 1.5
    with pytest.raises(TunerError, match=r"day.csv: a day needs 24 rows, one per hour 0-23; missing hours 23"):
        read_hourly_rates("day.csv", "".join(f"{h},1\n" for h in range(23)))
    with pytest.raises(TunerError, match=r"day.csv, line 2: expected `hour,rps`"):
        read_hourly_rates("day.csv", "0,1\nnoon,2\n")
    with pytest.raises(TunerError, match=r"line 2: hour 0 is listed twice"):
        read_hourly_rates("day.csv", "0,1\n0,2\n")
    with pytest.raises(TunerError, match=r"line 1: the rate must be 0 or more req/s, got -1"):
        read_hourly_rates("day.csv", "0,-1\n")
