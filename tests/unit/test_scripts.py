"""``scripts/test`` runs every stage and fails at the end if any failed. It runs here from a
copy of the repository's ``scripts/`` beside a ``.venv/bin`` whose ``python``, ``ruff`` and
``mypy`` only log their arguments, one of them failing, so the script's control flow is
what is tested (the tools themselves are run by the suite they stand in for)."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from testbed.harness import scaled

ROOT = Path(__file__).resolve().parents[2]

TOOL = """#!/bin/sh
call="$(basename "$0") $*"
echo "$call" >> "{log}"
case "$call" in {fail}) exit 1 ;; esac
"""


def _tree(tmp_path: Path, fail: str) -> tuple[Path, Path]:
    """A copy of ``scripts/`` with a no-op setup, and tools that log each call, failing the
    calls that match the shell pattern ``fail``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    tools = [(f".venv/bin/{tool}", TOOL.format(log=log, fail=fail)) for tool in ("python", "ruff", "mypy")]
    for name, text in [("scripts/setup", "#!/bin/sh\nexit 0\n"), *tools]:
        path = tmp_path / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return tmp_path / "scripts" / "test", log


@pytest.mark.parametrize("fail", ['"ruff "*', '*"-n 2 tests/unit"', '*"not slow"', '*"-m slow"',
                                  '*test_wire_fuzz.py', '*test_crash.py'])
def test_scripts_test_runs_every_stage_and_then_fails(tmp_path: Path, fail: str) -> None:
    script, log = _tree(tmp_path, fail)
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=scaled(60))
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls[:2]] == ["ruff", "mypy"], calls
    assert len([c for c in calls if c.startswith("python -m pytest")]) == 5, calls  # every stage ran
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("scripts/test: failed: "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1  # the one stage that failed, named


def test_scripts_test_passes_when_every_stage_passes(tmp_path: Path) -> None:
    script, log = _tree(tmp_path, '"no such call"')
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=scaled(60))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert len([c for c in log.read_text().splitlines() if c.startswith("python -m pytest")]) == 5
