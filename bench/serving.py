"""The OpenAI-compatible servers `edgespec bench serve` measures, each started once as its own process on loopback.

    edgespec_cluster(...)   the demo's cluster (harness.cluster.LocalCluster), its coordinator serving the OpenAI API
    llama_server(...)       llama.cpp's own server, built from the vendored sources (bench.llamacpp_tools)
    vllm_server(...)        vLLM's OpenAI server from .venv-vllm (the model dequantised to a Hugging Face directory)

Every server is up when its GET /health answers 200, and every one stops with ``Server.stop()``: its process
group gets SIGTERM, then SIGKILL after a grace period, so that helper processes (vLLM's engine core) go with it.
A server that cannot start raises ServerFailed with how it ended and the tail of its log.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.cluster import LocalCluster, ServiceFailed
from edgespec.ops.llama_build import describe_exit

HTTP_API = re.compile(r"OpenAI-compatible API on http://(\S+):(\d+)/v1")   # the coordinator's log line


class ServerFailed(RuntimeError):
    """A server did not start; the message says how it ended and ends with its log's tail."""


@dataclass
class Server:
    """One OpenAI-compatible HTTP server, started once for the whole run."""
    name: str
    base_url: str                          # http://127.0.0.1:PORT (the API under /v1)
    settings: str                          # how it was started, for the report
    shutdown: Callable[[], None]
    pids: list[int] = field(default_factory=list)   # processes whose CPU time is the server's
    stopped: bool = False

    def stop(self) -> None:
        """Stop it (once: a second call does nothing)."""
        if not self.stopped:
            self.stopped = True
            self.shutdown()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants so far, from /proc (0 once it is gone)."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def stop_group(process: subprocess.Popen, grace_seconds: float = 15) -> None:
    """SIGTERM to the process's group (it leads one: start_new_session), SIGKILL to what is left after the grace."""
    if process.poll() is not None:
        _kill_leftovers(process.pid)
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    _kill_leftovers(process.pid)
    process.wait()


def _kill_leftovers(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_ready(name: str, process: subprocess.Popen, log_path: Path, base_url: str, timeout_seconds: float) -> None:
    """Poll GET /health until it answers 200; ServerFailed (with the log's tail) if the process ends or time runs
    out."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(f"{name} {describe_exit(process.returncode)} while starting (log: {log_path}):\n"
                               f"{log_tail(log_path)}")
        if _healthy(base_url):
            return
        time.sleep(0.5)
    stop_group(process)
    raise ServerFailed(f"{name} did not answer /health within {timeout_seconds:.0f}s (log: {log_path}):\n"
                       f"{log_tail(log_path)}")


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_http_server(name: str, command: list[str], log_dir: Path, port: int, timeout_seconds: float,
                      settings: str, env: dict[str, str] | None = None) -> Server:
    """Start ``command`` (which serves HTTP on ``port``) in a process group of its own and wait for /health."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "w") as sink:
        sink.write(f"$ {' '.join(command)}\n")
        sink.flush()
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env={**os.environ, **(env or {})})
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(name, process, log_path, base_url, timeout_seconds)
    except BaseException:
        stop_group(process)
        raise
    return Server(name, base_url, settings, lambda: stop_group(process), [process.pid])


def llama_server(binary: Path, model: Path, draft: Path | None, *, slots: int, ctx_per_slot: int, threads: int,
                 cpus: str, log_dir: Path, name: str, timeout_seconds: float = 600) -> Server:
    """llama.cpp's server on ``model`` with ``slots`` parallel slots (continuous batching, ``ctx_per_slot`` cells
    each; no prompt cache in host memory: no request reuses another's prompt); with ``draft``, its own
    speculative decoding with that draft model (llama.cpp's default draft length)."""
    port = free_port()
    args = ["-m", str(model), "-t", str(threads), "-np", str(slots), "-c", str(slots * ctx_per_slot),
            "--cont-batching", "--cache-ram", "0", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    if draft is not None:
        args += ["-md", str(draft), "--spec-type", "draft-simple", "-td", str(threads)]
    settings = f"{binary.name} {' '.join(args)} (pinned to CPU {cpus})"
    return start_http_server(name, ["taskset", "-c", cpus, str(binary), *args], log_dir, port, timeout_seconds,
                             settings)


def vllm_server(python: Path, model_dir: Path, *, max_sequences: int, max_model_len: int, cpus: str, log_dir: Path,
                timeout_seconds: float = 900) -> Server:
    """vLLM's OpenAI server on the Hugging Face directory ``model_dir`` (bfloat16, prefix caching off), pinned
    to ``cpus`` with its OpenMP threads bound to them, served as "target"."""
    port = free_port()
    args = ["--model", str(model_dir), "--served-model-name", "target", "--dtype", "bfloat16",
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_sequences),
            "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port)]
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": cpus, "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    settings = f"vllm.entrypoints.openai.api_server {' '.join(args)} (pinned to CPU {cpus}, KV cache 2 GiB)"
    return start_http_server("vllm", ["taskset", "-c", cpus, str(python), "-m", "vllm.entrypoints.openai.api_server",
                                      *args], log_dir, port, timeout_seconds, settings, env)


def edgespec_cluster(layout: dict, log_dir: Path, timeout_seconds: float = 60, name: str = "edgespec") -> Server:
    """The demo's cluster (verifier, drafter, coordinator on loopback, as ``layout`` places them) with the
    coordinator's OpenAI HTTP API on a free port."""
    cluster = LocalCluster(log_dir, **{**layout, "coordinator_args": [*layout.get("coordinator_args", []),
                                                                     "--http-port", "0"]})
    try:
        cluster.__enter__()
    except ServiceFailed as error:
        raise ServerFailed(f"edgespec's cluster did not start: {error}") from None
    try:
        log_path = cluster.coordinator.log_path
        # the last one: services append to their logs, and a log dir used before holds earlier runs' addresses
        found = ([None] + list(HTTP_API.finditer(log_path.read_text(errors="replace"))))[-1]
        if found is None:
            raise ServerFailed(f"edgespec's coordinator did not log its HTTP address (log: {log_path}):\n"
                               f"{log_tail(log_path)}")
        base_url = f"http://{found[1]}:{found[2]}"
        deadline = time.monotonic() + timeout_seconds
        while not _healthy(base_url):
            if notes := cluster.exit_notes():
                raise ServerFailed("edgespec's cluster: " + "; ".join(notes))
            if time.monotonic() > deadline:
                raise ServerFailed(f"edgespec's coordinator did not answer {base_url}/health within "
                                   f"{timeout_seconds:.0f}s (log: {log_path}):\n{log_tail(log_path)}")
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
    where = (f"verifier on CPU {layout['verifier_cpus']}, drafter and coordinator on CPU {layout['edge_cpus']}"
             if layout.get("verifier_cpus") else "all services on the same CPUs")
    settings = (f"verifier {' '.join(layout.get('verifier_args', []))}; drafter "
                f"{' '.join(layout.get('drafter_args', []))}; coordinator "
                f"{' '.join(layout.get('coordinator_args', [])) or '(defaults)'} --http-port 0; {where}")
    return Server(name, base_url, settings, cluster.stop, [s.process.pid for s in cluster.services])
