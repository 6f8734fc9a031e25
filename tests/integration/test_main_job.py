"""The README's main job, exactly as written there, in a fresh $TUNER_HOME: it must end in a recommendation on
any machine of this kind, validated against vLLM's default: two launches of each, interleaved, stored as marked
trials, and the gain stated with its interval (or, where the search trial did not carry the traffic and vLLM's
default did, the default, measured once). The load search adapts the load to the machine, going below the demo's
traffic as far as the machine needs: where the machine (slow, or crowded by the other tests' engines) carries less
than that traffic, the recommendation is the configuration that carries the most of it, and says so. The same
command at ten times the demo's traffic is the demo as a machine ten times slower sees it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.vllm


def readme_main_job() -> str:
    """The command under the README's "Run the main job" paragraph (its first indented line)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("Run the main job"):]
    return next(line.strip() for line in section.splitlines() if line.startswith("    "))


def test_the_readmes_main_job_recommends_a_vllm_serve_command(tmp_path):
    command = readme_main_job()
    assert command.startswith(".venv/bin/tuner study create demo") and "tuner study best demo" in command
    # At most two flags beside the study's name: the demo is study create's default.
    assert len(re.findall(r"(?<= )--[a-z-]+", command)) <= 2, command
    assert_recommends(command, tmp_path)


def test_the_main_job_at_ten_times_its_traffic_recommends_as_on_a_machine_ten_times_slower(tmp_path):
    # The same command, the demo's traffic ten times higher (x60, about 81.5 req/s): no 2-core machine of this
    # kind carries it, so the load search must go below it as far as this machine needs, as it must for the
    # demo's own traffic on a machine ten times slower.
    command = readme_main_job().replace("tuner study create demo", "tuner study create demo --rate-scale 60", 1)
    stdout, best = assert_recommends(command, tmp_path)
    assert not best["score"]["feasible"] and best["score"]["capacity"]["rps"] > 0, best["score"]
    said = " ".join(stdout.split())
    assert "it does not carry your traffic within the boundary (" in said, stdout[-3000:]
    assert re.search(r"at your traffic \(8\d\.?\d* req/s\)", said), stdout[-3000:]  # the traffic it measured at


def assert_recommends(command: str, tmp_path) -> tuple[str, dict]:
    """Run the main job's `command` in a fresh $TUNER_HOME: it must end in a recommendation, validated against vLLM's
    default or said to be measured once, and state it. Returns what it printed and `study best --json`."""
    env = {**os.environ, "TUNER_HOME": str(tmp_path / "home")}
    env.pop("TUNER_STORAGE", None)
    env.pop("TUNER_ARTIFACTS", None)
    result = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=3600)  # six launches on a slow, crowded machine: not a speed test
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^\s+vllm serve \S+", result.stdout, re.MULTILINE), result.stdout[-3000:]
    assert "carries" in result.stdout  # the capacity, within the boundary
    # Every engine, launched in Ray's workers, ran as tuner launches a CPU engine: its worker inside the engine
    # core, where vLLM binds no OpenMP thread (it logs its binding only when it starts a worker process).
    logs = list((tmp_path / "home").rglob("server.log"))
    assert logs and not [p for p in logs if "OpenMP thread binding" in p.read_text(errors="replace")], logs
    best = json.loads(subprocess.run([sys.executable, "-m", "tuner", "study", "best", "demo", "--json"], env=env,
                                     capture_output=True, text=True, check=True).stdout)
    status = json.loads(subprocess.run([sys.executable, "-m", "tuner", "study", "status", "demo", "--json"],
                                       env=env, capture_output=True, text=True, check=True).stdout)
    exported = json.loads(subprocess.run([sys.executable, "-m", "tuner", "study", "export", "demo"], env=env,
                                         capture_output=True, text=True, check=True).stdout)
    assert_spent_is_stated(best, status, exported, result.stdout)
    if best["validation"] is None:
        # No finalist to launch again, and the answer is vLLM's default, said to be measured once: the default
        # carried the demo's traffic and the search trial did not, or (a machine too slow for that traffic) no
        # configuration carried it and the search trial carried no load within the boundary at all.
        searched = [t for t in exported["trials"] if t["trial_number"] != best["baseline"]["trial"]]
        assert best["trial"] == best["baseline"]["trial"] and searched, result.stdout[-3000:]
        if best["score"]["feasible"]:
            assert not any(t["score"] and t["score"]["feasible"] for t in searched), searched
        else:
            assert not any(t["score"] and t["score"]["capacity"]["rps"] for t in searched), searched
            assert "it does not carry your traffic within the boundary (" in result.stdout, result.stdout[-3000:]
            assert "no configuration tried does: it carries the most of it" in result.stdout, result.stdout[-3000:]
        assert "not validated: study demo has no feasible configuration other than vLLM's default" in result.stdout
        assert re.search(r"vLLM's default configuration \(trial \d+\) is itself the best found, measured once: not "
                         r"validated", result.stdout), result.stdout[-3000:]
        assert status["validation_launches"] == 0
    else:
        assert_validated(best, status, exported, result.stdout)
    return result.stdout, best


def assert_spent_is_stated(best: dict, status: dict, exported: dict, stdout: str) -> None:
    """What the answer cost, everywhere it is read: the run's line, `status`, `best` and the export agree, every
    launched trial has its share, and the run's slot time beyond its trials' is its idle time."""
    assert re.search(r"^spent CPU slot time \S+: startup \S+, probes \S+, draining \S+, idle \S+; \d+ launches"
                     r"(, \d+ cold starts, \d+ warm)?$", stdout, re.MULTILINE), stdout[-3000:]
    spent = status["spent"]
    assert spent == best["spent"] == exported["spent"] and spent["unit"] == "CPU slot" and spent["runs"] == 1
    launched = [t for t in exported["trials"] if t["timings"]]
    assert [t["trial"] for t in spent["trials"]] == [t["trial_number"] for t in launched]
    total = spent["total"]
    assert all(total[part] >= 0 for part in ("startup_s", "probes_s", "draining_s", "idle_s"))
    assert total["startup_s"] > 0 and total["probes_s"] > 0
    assert total["total_s"] == pytest.approx(sum(t["total_s"] for t in spent["trials"]) + total["idle_s"])


def assert_validated(best: dict, status: dict, exported: dict, stdout: str) -> None:
    """`study run` validated its best against vLLM's default, and `best` states the verdict with its interval. On a
    crowded machine a launch can carry none of the loads it probed within the boundary: then there is no ratio to
    give an interval to, and the verdict says which launches carried nothing instead of printing a gain."""
    validation = best["validation"]
    assert validation["complete"], stdout[-3000:]
    if validation["gain"] is not None:
        verdict = re.search(r"^.*95% CI \d+\.\d\d-\d+\.\d\d, 2 repeats each\).*$", stdout, re.MULTILINE)
        assert verdict and verdict.group(0).endswith((": keep it", ": recommended")), stdout[-3000:]
    else:
        nothing = [a for a in validation["arms"] if min(a["values"]) <= 0]
        assert nothing, validation
        verdict = re.search(r"^no interval for trial \d+ against vLLM's default \(.*carried no load within the "
                            r"boundary in [12] of 2 launches.*\): (keep vLLM's default|trial \d+ is recommended)$",
                            stdout, re.MULTILINE)
        assert verdict, stdout[-3000:]
    if not best["score"]["feasible"]:  # this machine carried less than the demo's traffic: said, not hidden
        assert "it does not carry your traffic within the boundary (" in stdout, stdout[-3000:]
    assert status["validation_launches"] == 4
    marks = [t["validation"] for t in exported["trials"] if t["validation"] is not None]
    # Round by round, the same order each time: vLLM's default, then the best search trial.
    assert [(m["round"], m["arm"]) for m in marks] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert len({m["of_trial"] for m in marks if m["arm"] == 1}) == 1 and all(m["arm"] == 0 or m["of_trial"]
                                                                             is not None for m in marks)
