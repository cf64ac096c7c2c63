"""docs/architecture.md §0 is the map of the tree: its first table names every top-level folder and every package
of edgespec/, names only folders that exist, and the registries its "Where a new thing goes" table points at
exist and are dicts (so a new folder or a renamed registry fails here until the map says so)."""
from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def section_zero() -> str:
    return DOC[DOC.index("## 0. Map"):DOC.index("## 1. ")]


def mapped_folders() -> set[str]:
    """The folders in the first column of §0's first table (`a/`, or several: `a/`, `b/`)."""
    table = section_zero().split("\n\n")[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {name.rstrip("/") for row in rows for name in re.findall(r"`([^`]+/)`", row.split("|")[1])}


def tracked_folders() -> set[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    top = {f.split("/")[0] for f in files if "/" in f and not f.startswith(".")}
    packages = {f"edgespec/{f.split('/')[1]}" for f in files
                if f.startswith("edgespec/") and f.count("/") == 2 and f.endswith("/__init__.py")}
    return top | packages


def test_the_map_names_every_folder_and_only_folders_that_exist():
    mapped, tracked = mapped_folders(), tracked_folders()
    assert {"edgespec/loop", "services", "harness"} <= mapped      # the table was found and read
    assert tracked - mapped - {"edgespec"} == set(), "folders the map of docs/architecture.md §0 does not name"
    assert {m for m in mapped if not (ROOT / m).is_dir()} == set(), "folders the map names that do not exist"


def test_every_registry_the_map_points_at_exists():
    table = section_zero().split("**Where a new thing goes**")[1]
    registries = re.findall(r"`([A-Z_]+)` of `([\w/]+)\.py`", table)
    assert len(registries) == 4
    for name, path in registries:
        module = importlib.import_module(path.replace("/", "."))
        registry = getattr(module, name)
        assert isinstance(registry, dict) and registry, f"{path}.py {name}"


def test_a_services_backend_choices_are_its_registry(capsys):
    """--backend offers exactly the registry's entries, so a backend added there is one a user can pick."""
    import pytest

    from services.drafter import __main__ as drafter
    from services.verifier import __main__ as verifier
    for service in (drafter, verifier):
        with pytest.raises(SystemExit):
            service.parse_args(["--backend", "nope"])
        choices = re.search(r"invalid choice: 'nope' \(choose from (.*)\)", capsys.readouterr().err).group(1)
        assert re.findall(r"'?(\w+)'?", choices) == list(service.BACKENDS)
        assert all(callable(load) for load in service.BACKENDS.values())
