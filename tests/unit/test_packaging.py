"""What an install puts into site-packages: the tuner package alone, with the data files it reads, those of the
repository's top-level folders search_spaces/ and storage/ included."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_only_the_tuner_package_with_its_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("tuner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"tuner"}, top
    for module in ("tuner/storage/repository.py", "tuner/workers/engine_guard.py", "tuner/search_spaces/loading.py"):
        assert module in names, module
    # What the code reads at run time: the migrations, the bundled spaces, traces and model configs.
    assert "tuner/storage/migrations/versions/0001_initial.py" in names
    assert {f"tuner/search_spaces/{p.name}" for p in (REPO / "search_spaces").glob("*.yaml")} <= set(names)
    assert "tuner/search_spaces/schema.json" in names  # the file format, for editors
    assert any(name.startswith("tuner/data/traces/") for name in names)
    # The report page is rendered from its template and stylesheet.
    assert {"tuner/report/templates/report.html.j2", "tuner/report/templates/report.css"} <= set(names)
