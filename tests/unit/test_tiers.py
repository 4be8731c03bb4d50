"""Every test module outside ``unit`` declares its tier, or the suite refuses to run
(``tests/support/tiers.py``): pytest with that plugin, in a child, on modules written here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collect(tmp_path: Path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return subprocess.run([sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path),
                           "-p", "tests.support.tiers", "-p", "no:cacheprovider", "--collect-only", "-q",
                           *args, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)


TEST = "def test_one() -> None:\n    pass\n"


def test_a_module_without_a_tier_or_with_two_is_refused(tmp_path: Path) -> None:
    proc = _collect(tmp_path, {
        "integration/test_new.py": TEST,
        "integration/test_both.py": "import pytest\npytestmark = [pytest.mark.fast, pytest.mark.slow]\n" + TEST,
        "integration/test_old.py": "import pytest\npytestmark = pytest.mark.fast\n" + TEST,
    })
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "test_new.py" in proc.stderr and "test_both.py" in proc.stderr, proc.stderr
    assert "test_old.py" not in proc.stderr, proc.stderr


def test_declared_modules_and_unit_modules_are_collected(tmp_path: Path) -> None:
    proc = _collect(tmp_path, {
        "integration/test_fast.py": "import pytest\npytestmark = pytest.mark.fast\n" + TEST,
        "integration/test_slow.py": "import pytest\npytestmark = [pytest.mark.slow, pytest.mark.timeout(9)]\n" + TEST,
        "unit/test_plain.py": TEST,
    })
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 tests collected" in proc.stdout, proc.stdout


def test_a_slow_marker_makes_a_test_slow_in_a_fast_module(tmp_path: Path) -> None:
    module = "import pytest\npytestmark = pytest.mark.fast\n@pytest.mark.clients\n" + TEST + TEST.replace("one", "two")
    proc = _collect(tmp_path, {"integration/test_mixed.py": module}, "-m", "not slow")
    assert "test_two" in proc.stdout and "test_one" not in proc.stdout, proc.stdout + proc.stderr
