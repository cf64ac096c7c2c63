"""The committed generated code must be exactly what scripts/gen_protos.py makes."""
import filecmp
import subprocess
import sys
from pathlib import Path

from harness.cluster import REPO_ROOT


def test_generated_code_matches_the_protos(tmp_path):
    subprocess.run([sys.executable, "scripts/gen_protos.py", "--out", str(tmp_path)], cwd=REPO_ROOT, check=True,
                   capture_output=True)
    fresh, committed = tmp_path / "edgespec" / "v1", REPO_ROOT / "edgespec" / "v1"
    names = sorted(p.name for p in fresh.iterdir() if p.is_file())
    assert names == sorted(p.name for p in committed.iterdir() if p.is_file() and p.suffix in (".py", ".pyi"))
    match, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, f"run `python scripts/gen_protos.py`: stale {mismatch + errors}"


def test_import_contracts_hold():
    """docs/architecture.md §8: pure core, independent services, a light edge client."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
