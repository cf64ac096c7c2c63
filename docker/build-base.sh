#!/usr/bin/env bash
# Build the base image edgespec-base:bookworm locally, for a docker daemon that reaches no image registry
# and whose builds have no network (this project's machines: the daemon runs in its own network namespace).
# Where a registry is reachable, skip this: the Dockerfiles default to python:3.11-slim-bookworm.
#
#   1. debootstrap a minimal Debian bookworm rootfs (python3.11, python3-venv, ca-certificates)
#   2. in a chroot (which has this host's network), create the venv /opt/edgespec and pip-install
#      edgespec's pinned dependencies from pyproject.toml, torch==2.13.0 as the CPU build
#   3. `docker import` the rootfs as edgespec-base:bookworm, labelled with the sha256 of the dependency list
#   Rerun it when pyproject.toml's dependencies change (compose-run.sh --local-base does, by that label);
#   the kept rootfs makes a rerun install only what is new.
#
# docker/*.Dockerfile then build with --build-arg BASE_IMAGE=edgespec-base:bookworm and every pip step
# there finds its requirement satisfied, so `docker build` needs no network.
#
# Needs root, debootstrap (apt-get install debootstrap), a docker daemon, and network to a Debian mirror
# and PyPI. Environment:
#   EDGESPEC_BASE_TAG   image to create (default edgespec-base:bookworm)
#   ROOTFS              where to build the rootfs (default /var/tmp/edgespec-base/rootfs; kept for reuse)
#   DEBIAN_MIRROR       (default http://deb.debian.org/debian)
#   TORCH_FIND_LINKS    a folder holding torch-2.13.0+cpu-*.whl (default /opt/wheels if it has one)
#   TORCH_INDEX_URL     else the PyTorch CPU index (default https://download.pytorch.org/whl/cpu)
#   LLAMA_CMAKE_ARGS  CPU features of the llama.cpp build (default x86-64-v3, no OpenMP; see docker/cloud.Dockerfile)
#   PIP_CERT            CA bundle pip should trust (a proxy's), used in the chroot only, not kept in the image
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${EDGESPEC_BASE_TAG:-edgespec-base:bookworm}
ROOTFS=${ROOTFS:-/var/tmp/edgespec-base/rootfs}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=OFF"}
if [ -z "${TORCH_FIND_LINKS:-}" ] && compgen -G "/opt/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
  TORCH_FIND_LINKS=/opt/wheels
fi
[ "$(id -u)" = 0 ] || { echo "build-base.sh: needs root (debootstrap, chroot)" >&2; exit 1; }

if [ ! -x "$ROOTFS/usr/bin/python3.11" ]; then
  echo "== debootstrap bookworm into $ROOTFS"
  rm -rf "$ROOTFS"; mkdir -p "$ROOTFS"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOTFS" "$MIRROR"
fi

echo "== installing the pinned dependencies into $ROOTFS/opt/edgespec (chroot)"
python3 - > "$ROOTFS/tmp/requirements.txt" <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["serve"]   # what the services' images install
print("\n".join(deps + ["setuptools>=68"]))
EOF
# the label lets scripts/compose-run.sh see when pyproject.toml's dependencies changed since the base was built
deps_sha=$(sha256sum "$ROOTFS/tmp/requirements.txt" | cut -c1-64)
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mounts=()
cleanup() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mount -t proc proc "$ROOTFS/proc"; mounts+=("$ROOTFS/proc")
torch_src=(--extra-index-url "$TORCH_INDEX_URL")
if [ -n "${TORCH_FIND_LINKS:-}" ]; then
  mkdir -p "$ROOTFS/tmp/torch-wheels"
  mount --bind "$TORCH_FIND_LINKS" "$ROOTFS/tmp/torch-wheels"; mounts=("$ROOTFS/tmp/torch-wheels" "${mounts[@]}")
  torch_src=(--find-links /tmp/torch-wheels)
fi
pip_cert=()
if [ -n "${PIP_CERT:-}" ]; then   # a host whose HTTPS goes through a proxy with its own CA: pip in the chroot trusts it too
  cp "$PIP_CERT" "$ROOTFS/tmp/pip-cert.pem"; pip_cert=(PIP_CERT=/tmp/pip-cert.pem)
fi
chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "${pip_cert[@]}" /bin/bash -euxc "
  [ -x /opt/edgespec/bin/python ] || python3 -m venv /opt/edgespec
  /opt/edgespec/bin/pip install --no-cache-dir --disable-pip-version-check ${torch_src[*]} 'torch==2.13.0'
  # llama-cpp-python compiles llama.cpp: g++ for the build only, purged after; flags as docker/*.Dockerfile
  if ! /opt/edgespec/bin/pip show llama-cpp-python 2>/dev/null | grep -qx 'Version: 0.3.36'; then
    apt-get update; apt-get install -y --no-install-recommends g++ make
    CMAKE_ARGS='$LLAMA_CMAKE_ARGS' /opt/edgespec/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
      -w /tmp/llama-wheels 'llama-cpp-python==0.3.36'
    apt-get purge -y --auto-remove g++ make
  fi
  /opt/edgespec/bin/pip install --no-cache-dir --disable-pip-version-check --find-links /tmp/llama-wheels \
    -r /tmp/requirements.txt
  rm -rf /tmp/llama-wheels
  site=/opt/edgespec/lib/python3.11/site-packages   # as the Dockerfiles do: torch's headers, C++ tests, protoc
  rm -rf \$site/torch/test \$site/torch/include \$site/torch/bin/test_* \$site/torch/bin/*Test \$site/torch/bin/protoc*
  /opt/edgespec/bin/python -c 'import llama_cpp, torch, transformers, grpc; print(\"torch\", torch.__version__, \"transformers\", transformers.__version__, \"grpcio\", grpc.__version__)'
"
cleanup; mounts=()

echo "== trimming the rootfs"
rmdir "$ROOTFS/tmp/torch-wheels" 2>/dev/null || true   # never rm -r: it may still be a bind mount
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS/tmp/requirements.txt" "$ROOTFS/tmp/pip-cert.pem" \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/root/.cache
: > "$ROOTFS/etc/resolv.conf"

echo "== docker import $TAG"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/opt/edgespec/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --change "LABEL org.edgespec.deps-sha256=$deps_sha" \
  --message "edgespec base: Debian bookworm, python3.11, edgespec's pinned dependencies in /opt/edgespec" \
  - "$TAG"
docker image ls "$TAG"
