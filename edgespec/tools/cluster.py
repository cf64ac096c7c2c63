"""Start verifier, drafter and coordinator as real processes on loopback.

Used by `edgespec demo`, `edgespec bench` and the RPC/system tests. Each service
binds port 0 and we read the port it logged; logs go to files in ``log_dir``.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (\S+):(\d+)")


class ServiceFailed(RuntimeError):
    pass


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log_path: Path
    address: str = ""

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_service(module: str, args: list[str], log_dir: Path, name: str, timeout_seconds: float = 600,
                  env: dict[str, str] | None = None) -> Service:
    """Start ``python -m module args --host 127.0.0.1 --port 0`` and wait until it listens."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    sink = open(log_path, "w")
    process = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args],
                               stdout=sink, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})})
    sink.close()
    service = Service(name, process, log_path)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        match = LISTENING.search(log_path.read_text(errors="replace"))
        if match:
            service.address = f"{match.group(1)}:{match.group(2)}"
            return service
        if process.poll() is not None:
            raise ServiceFailed(f"{name} exited with {process.returncode}:\n{service.log_tail()}")
        time.sleep(0.1)
    stop_service(service)
    raise ServiceFailed(f"{name} did not start within {timeout_seconds}s:\n{service.log_tail()}")


def stop_service(service: Service, grace_seconds: float = 10) -> None:
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
        try:
            service.process.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait()


@dataclass
class LocalCluster:
    """verifier + drafter + coordinator on loopback; a context manager."""
    log_dir: Path
    verifier_args: list[str] = field(default_factory=list)
    drafter_args: list[str] = field(default_factory=list)
    coordinator_args: list[str] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)

    def __enter__(self) -> "LocalCluster":
        try:
            self.verifier = self._start("services.verifier", self.verifier_args, "verifier")
            self.drafter = self._start("services.drafter", self.drafter_args, "drafter")
            self.coordinator = self._start("services.coordinator", [
                "--verifier", self.verifier.address, "--drafter", self.drafter.address, *self.coordinator_args],
                "coordinator")
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, module: str, args: list[str], name: str) -> Service:
        service = start_service(module, args, self.log_dir, name)
        self.services.append(service)
        return service

    def stop(self) -> None:
        for service in reversed(self.services):
            stop_service(service)
        self.services.clear()

    def __exit__(self, *exc) -> None:
        self.stop()
