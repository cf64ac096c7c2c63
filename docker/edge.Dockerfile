# edgespec edge image: the coordinator (default command), the drafter (draft model) and the edge client CLI.
#
#   docker build -f docker/edge.Dockerfile -t edgespec-edge:0.1.0 .
#   docker run --rm -v ~/.cache/edgespec:/var/cache/edgespec:ro edgespec-edge:0.1.0 python -m services.coordinator \
#       --verifier cloud-a:50061,cloud-b:50061 --drafter drafter:50062        # coordinator (the default command)
#   docker run --rm -v ~/.cache/edgespec:/var/cache/edgespec:ro -e EDGESPEC_HEALTH_ADDR=127.0.0.1:50062 \
#       edgespec-edge:0.1.0 python -m services.drafter                       # drafter
#   docker run --rm edgespec-edge:0.1.0 edgespec generate --coordinator HOST:50051 "prompt"   # edge client
#
# BASE_IMAGE: the official python:3.11-slim-bookworm where a registry is reachable; a machine without one
# builds a local base with docker/build-base.sh (Debian bookworm rootfs with the dependencies already in
# /opt/edgespec) and passes --build-arg BASE_IMAGE=edgespec-base:bookworm. Then every pip step below finds
# its requirement satisfied and the build needs no network.
# The models are not in the image: mount a model cache ($EDGESPEC_CACHE/models, filled by
# `edgespec prepare-models` / `python -m edgespec.ops.prepare`) at /var/cache/edgespec.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# llama-cpp-python (the llama.cpp backend) is an sdist that compiles llama.cpp: its wheel is built in this
# throwaway stage, which has the compilers, so the image carries the wheel and no compiler. LLAMA_CMAKE_ARGS
# picks the CPU features the kernels use: x86-64-v3 (AVX2, FMA, F16C: x86 servers since 2013) by default, so
# the image runs on any such host; "-DGGML_NATIVE=ON" builds for the build machine's own CPU (AVX-512 where it
# has it). No OpenMP (llama.cpp's own thread pool), so the runtime needs no libgomp. A local base from
# docker/build-base.sh already holds llama-cpp-python, built the same way: the stage then builds nothing.
FROM ${BASE_IMAGE} AS llama-wheel
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=OFF"
RUN set -eux; \
    mkdir -p /wheels; \
    if ! /opt/edgespec/bin/python -c 'import llama_cpp' 2>/dev/null; then \
        apt-get update; apt-get install -y --no-install-recommends g++ make; \
        CMAKE_ARGS="$LLAMA_CMAKE_ARGS" pip wheel --no-cache-dir --no-deps -w /wheels "llama-cpp-python==0.3.36"; \
    fi

FROM ${BASE_IMAGE}

# torch is pinned to the CPU build (the PyPI default pulls multi-GB CUDA wheels); pip takes 2.13.0+cpu
# from this index. A GPU host swaps the index (e.g. .../whl/cu128) and runs with --device cuda.
# Dropped from torch in the same layer (nothing here uses them): C++ headers, C++ test binaries, protoc.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV VIRTUAL_ENV=/opt/edgespec \
    PATH=/opt/edgespec/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    EDGESPEC_CACHE=/var/cache/edgespec \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    EDGESPEC_COORDINATOR_HOST=0.0.0.0 \
    EDGESPEC_COORDINATOR_PORT=50051 \
    EDGESPEC_DRAFTER_HOST=0.0.0.0 \
    EDGESPEC_DRAFTER_PORT=50062 \
    EDGESPEC_HEALTH_ADDR=127.0.0.1:50051

RUN set -eux; \
    [ -x /opt/edgespec/bin/python ] || python3 -m venv /opt/edgespec; \
    pip install --no-cache-dir --extra-index-url "$TORCH_INDEX_URL" "torch==2.13.0" "setuptools>=68"; \
    site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    rm -rf "$site/torch/test" "$site/torch/include" "$site"/torch/bin/test_* "$site"/torch/bin/*Test "$site"/torch/bin/protoc*; \
    getent group 10001 >/dev/null || groupadd --gid 10001 edgespec; \
    getent passwd 10001 >/dev/null || useradd --uid 10001 --gid 10001 --home-dir /home/edgespec --create-home \
        --shell /usr/sbin/nologin edgespec; \
    mkdir -p /var/cache/edgespec/models; \
    chown -R 10001:10001 /var/cache/edgespec

COPY pyproject.toml README.md /opt/edgespec-src/
COPY edgespec /opt/edgespec-src/edgespec
COPY services /opt/edgespec-src/services
COPY edge_client /opt/edgespec-src/edge_client
# The pinned dependencies come from pyproject.toml; --no-build-isolation uses the setuptools above. Installed
# in place (-e) from root-owned /opt/edgespec-src, so data files next to the modules (JSON weights, scenarios)
# are there exactly as in the tree, whatever the package-data settings.
COPY --from=llama-wheel /wheels /tmp/llama-wheels
RUN set -eux; \
    pip install --no-cache-dir --no-build-isolation --find-links /tmp/llama-wheels -e "/opt/edgespec-src[serve]"; \
    rm -rf /tmp/llama-wheels; \
    python -c "import llama_cpp, torch, transformers, grpc, edgespec, services, edge_client; assert torch.__version__.startswith('2.13.0'), torch.__version__"

USER 10001:10001
WORKDIR /home/edgespec
VOLUME ["/var/cache/edgespec"]
EXPOSE 50051 50062

# gRPC health (grpc.health.v1, service ""): exit 0 only when SERVING. The coordinator's port by default; the
# drafter sets EDGESPEC_HEALTH_ADDR=127.0.0.1:50062. EDGESPEC_HEALTH_TLS_CA (and _CERT,
# _KEY, _NAME for mutual TLS / the certificate's name) switch the probe to TLS; health needs no token.
HEALTHCHECK --interval=15s --timeout=6s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os,sys,grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; e=os.environ.get; a=e('EDGESPEC_HEALTH_ADDR','127.0.0.1:50051'); r=lambda p: open(p,'rb').read() if p else None; c=grpc.secure_channel(a, grpc.ssl_channel_credentials(r(e('EDGESPEC_HEALTH_TLS_CA')), r(e('EDGESPEC_HEALTH_TLS_KEY')), r(e('EDGESPEC_HEALTH_TLS_CERT'))), [('grpc.ssl_target_name_override', e('EDGESPEC_HEALTH_TLS_NAME','localhost'))]) if e('EDGESPEC_HEALTH_TLS_CA') else grpc.insecure_channel(a); sys.exit(g.HealthStub(c).Check(h.HealthCheckRequest(service=''), timeout=5).status != h.HealthCheckResponse.SERVING)"]

CMD ["python", "-m", "services.coordinator"]
