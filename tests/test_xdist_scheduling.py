"""The suite's xdist scheduler (``tests/xdist_scheduling.py``) recovers from a lost worker.

A real ``pytest -n 1 --dist loadfile`` session over three files, whose middle one kills its worker once (the
test passes when run again): with pytest-xdist's own file scheduler it never ends (the replacement worker is
handed the one-test file and a finished file as an empty unit); with this suite's it ends, the crash reported
as a failure and every other test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FILES = {
    "test_a.py": "def test_a1():\n    pass\n\n\ndef test_a2():\n    pass\n",
    "test_b.py": (
        "import os\nfrom pathlib import Path\n\n\n"
        "def test_b1():\n    mark = Path(__file__).with_name('crashed')\n"
        "    if not mark.exists():\n        mark.touch()\n        os._exit(1)\n\n\n"
        "def test_b2():\n    pass\n"
    ),
    "test_c.py": "def test_c1():\n    pass\n",
}


def test_a_session_that_loses_a_worker_ends_with_the_crash_reported_and_the_rest_run(tmp_path: Path) -> None:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text("from tests.xdist_scheduling import pytest_xdist_make_scheduler  # noqa\n")
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))} | {"PYTHONPATH": str(repo)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "--dist", "loadfile", "--no-loadscope-reorder",
         "-p", "no:cacheprovider", "-p", "no:randomly", "-q", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert "[gw0] node down: Not properly terminated" in said, said  # the worker was lost
    assert done.returncode == 1 and "1 failed, 5 passed" in said, said  # b1 failed (the crash), then run again
