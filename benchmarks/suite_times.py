"""The test suite's time per file, slowest first, from the JUnit XML that pytest writes (`--junitxml`).

    .venv/bin/python -m pytest -q --junitxml=suite.xml
    .venv/bin/python benchmarks/suite_times.py suite.xml [other.xml ...]

With several files (runs of the same suite, say one on an idle machine and one on a slow one) the columns stand
side by side. Module-scoped fixtures are counted in the first test that uses them, as pytest does."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def times_per_file(junit_xml: Path) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds and tests per test file (setup, call and teardown of each test)."""
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "?").split(".")[-1]
        seconds[module] += float(case.get("time", 0))
        counts[module] += 1
    return seconds, counts


def _minutes(s: float) -> str:
    tenths = round(s * 10)  # rounded once, so that 179.96 s reads 3:00.0, not 2:60.0
    return f"{tenths // 600}:{tenths % 600 / 10:04.1f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml", nargs="+", type=Path)
    args = parser.parse_args(argv)
    runs = [times_per_file(path) for path in args.junit_xml]
    files = sorted({f for seconds, _ in runs for f in seconds}, key=lambda f: -runs[0][0].get(f, 0.0))
    header = ["file", "tests", *(path.name for path in args.junit_xml)]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for f in files:
        cells = [_minutes(seconds[f]) if f in seconds else "" for seconds, _ in runs]
        print(f"| {f} | {runs[0][1].get(f, 0)} | " + " | ".join(cells) + " |")
    print(f"| all | {sum(runs[0][1].values())} | " + " | ".join(_minutes(sum(s.values())) for s, _ in runs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
