"""How much of a test run's time vLLM engines spent starting, from the server logs it left behind.

Every engine a test launches writes a `server.log` under pytest's base temp folder. vLLM stamps each line to the
second, so a log gives its engine's start (its first stamped line) to "Starting vLLM server" (serving) and to its
last line. The API server's own imports, before its first line, are not seen: each start is under-counted by
those few seconds.

    .venv/bin/python benchmarks/suite_launches.py /tmp/pytest-of-$USER/pytest-N [--json out.json]

prints the launches, their startup and their life by test (the folder pytest made for it), longest first.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

STAMP = re.compile(r"^\(\w+ pid=\d+\) \w+ \d\d-\d\d (\d\d):(\d\d):(\d\d)")
SERVING = "Starting vLLM server"
DAY_S = 24 * 3600


@dataclass(frozen=True)
class Launch:
    """One engine's log: the test folder it is under, and its seconds to serving (None if it never served) and
    from its first line to its last."""

    test: str
    startup_s: int | None
    life_s: int


def read_launch(log: Path, base: Path) -> Launch | None:
    """The launch a server.log records; None for a log with no stamped line (vLLM refused the settings)."""
    first = serving = last = None
    for line in log.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
        if first is None:
            first = t
        t += DAY_S if t < first else 0  # a log that runs past midnight
        if serving is None and SERVING in line:
            serving = t
        last = t
    if first is None or last is None:
        return None
    parts = log.relative_to(base).parts
    folder = parts[1] if parts[0].startswith("popen-") else parts[0]  # pytest-xdist: a folder per worker
    return Launch(re.sub(r"\d+$", "", folder), None if serving is None else serving - first, last - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="pytest's base temp folder of the run")
    parser.add_argument("--json", type=Path, help="also write every launch here")
    args = parser.parse_args()
    launches = [launch for log in sorted(args.base.rglob("server.log"))
                if (launch := read_launch(log, args.base)) is not None]
    if not launches:
        raise SystemExit(f"no engine log under {args.base}")
    by_test: dict[str, list[Launch]] = {}
    for launch in launches:
        by_test.setdefault(launch.test, []).append(launch)
    print("| test folder | launches | startup, s | life, s |\n|---|---|---|---|")
    for test, group in sorted(by_test.items(), key=lambda kv: -sum(x.life_s for x in kv[1])):
        print(f"| {test} | {len(group)} | {sum(x.startup_s or 0 for x in group)} | {sum(x.life_s for x in group)} |")
    started = [x.startup_s for x in launches if x.startup_s is not None]
    life = sum(x.life_s for x in launches)
    print(f"\n{len(launches)} launches, {len(started)} served; startup median {statistics.median(started):.0f} s "
          f"(min {min(started)}, max {max(started)}), {sum(started)} s in all: {sum(started) / life:.0%} of the "
          f"engines' {life} s of life")
    if args.json:
        args.json.write_text(json.dumps([asdict(x) for x in launches], indent=1))


if __name__ == "__main__":
    main()
