"""Only the worker pool and the study runner import Ray: reading a study back and rendering its report do not."""

import subprocess
import sys

LIGHT_MODULES = ("tuner.study.recommendation", "tuner.study.plan", "tuner.report")


def test_reading_a_study_and_its_report_imports_no_ray():
    # A fresh interpreter: this test process may hold Ray already, loaded by other tests.
    check = "; ".join([*(f"import {module}" for module in LIGHT_MODULES), "import sys",
                       "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"])
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
