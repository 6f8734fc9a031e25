"""Durations as tuner writes them read back as the same seconds, to three digits or to the second."""

from __future__ import annotations

import pytest

from tuner.common.durations import format_duration, parse_duration


@pytest.mark.parametrize(("seconds", "text", "read"), [
    (0.0285, "0.0285s", 0.0285), (5.24, "5.24s", 5.24), (45, "45s", 45), (59.6, "1m00s", 60), (321.8, "5m22s", 322),
    (3600, "1h00m00s", 3600), (3730, "1h02m10s", 3730), (90061, "25h01m01s", 90061)])
def test_a_duration_is_written_to_three_digits_or_to_the_second_and_reads_back(seconds, text, read):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(read)
