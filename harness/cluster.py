"""Start verifiers, drafter and coordinator as real processes on loopback.

Used by `edgespec demo`, `edgespec bench speed` and the RPC/system/chaos tests. Each
service binds port 0 (or a given port, to restart it in place) and we read the
port it logged; logs go to files in ``log_dir``. With a ``link`` profile, each
verifier sits behind a WAN delay proxy (harness.link) and the coordinator
talks to the proxies: the edge-cloud link, emulated on real sockets.
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

from harness.link import DelayProxy, LinkProfile
from edgespec.ops.llama_build import describe_exit, installed as installed_build

REPO_ROOT = Path(__file__).resolve().parents[1]   # the source checkout harness/ lives in
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT}
LISTENING = re.compile(r"listening on (\S+):(\d+)")


class ServiceFailed(RuntimeError):
    pass


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log_path: Path
    address: str = ""
    module: str = ""                  # how to start it again (LocalCluster.restart)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None  # extra environment it was started with
    cpus: str | None = None
    python: str | None = None          # the interpreter it runs on (None: this one)

    def exit_note(self) -> str | None:
        """One line saying how the service ended, or None while it runs."""
        code = self.process.poll()
        if code is None:
            return None
        note = f"{self.name} {describe_exit(code)}"
        args = list(self.process.args)
        engine = args[args.index("--backend") + 1] if "--backend" in args[:-1] else "torch"
        crashed = code < 0 and -code in CRASH_SIGNALS
        if crashed and engine == "llamacpp":
            build = installed_build() or {}
            note += (f" in llama.cpp (build {build.get('variant', 'unknown')}): that build may not run on this CPU; "
                     f"`bash scripts/install.sh` self-tests it and falls back to a portable one, or set "
                     f"EDGESPEC_LLAMA_BUILD=portable and run it again")
        elif crashed:
            note += f" in its engine ({engine}; the log has the Python stack it died in)"
        return note + f" (log: {self.log_path})"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def service_path(python: str | None) -> str:
    """A service's PYTHONPATH: this checkout, then this process's own PYTHONPATH when the service runs on this
    interpreter (packages installed aside, as on a GPU host without a registry); another interpreter (the vLLM
    environment's) gets the checkout alone, not this environment's paths."""
    extra = os.environ.get("PYTHONPATH", "") if python is None else ""
    return os.pathsep.join([str(REPO_ROOT), *filter(None, extra.split(os.pathsep))])


def start_service(module: str, args: list[str], log_dir: Path, name: str, timeout_seconds: float = 600,
                  env: dict[str, str] | None = None, port: int = 0, cpus: str | None = None,
                  python: str | None = None) -> Service:
    """Start ``python -m module args --host 127.0.0.1 --port PORT`` and wait until it listens.

    cpus: a taskset CPU list ("0", "1-3") to pin the process to (emulating separate machines).
    python: another interpreter (a vLLM verifier runs on the vLLM environment's); default this one.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    sink = open(log_path, "a")
    sink.write(f"==== starting {name}\n")
    sink.flush()
    pin = ["taskset", "-c", cpus] if cpus else []
    process = subprocess.Popen([*pin, python or sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args],
                               stdout=sink, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                               env={**os.environ, "PYTHONPATH": service_path(python), **(env or {})})
    sink.close()
    service = Service(name, process, log_path)
    deadline = time.monotonic() + timeout_seconds
    try:
        while time.monotonic() < deadline:
            match = LISTENING.search(log_path.read_text(errors="replace").rsplit(f"==== starting {name}", 1)[-1])
            if match:
                service.address = f"{match.group(1)}:{match.group(2)}"
                return service
            if process.poll() is not None:
                if process.returncode < 0:   # died by a signal: one line, the stack is in the log
                    raise ServiceFailed(service.exit_note())
                raise ServiceFailed(f"{name} exited with {process.returncode}:\n{service.log_tail()}")
            time.sleep(0.1)
    except BaseException:   # interrupted (Ctrl-C, SIGTERM) while it starts: no cluster holds it yet
        stop_service(service)
        raise
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
    """verifiers + drafter + coordinator on loopback; a context manager.

    verifier_cpus / edge_cpus: taskset CPU lists, to keep the "cloud" and the
    "edge" from sharing cores as they would on one machine.
    """
    log_dir: Path
    verifier_args: list[str] = field(default_factory=list)
    drafter_args: list[str] = field(default_factory=list)
    # More drafters, by name (the first one, drafter_args, is "draft"): the coordinator's router picks among them.
    extra_drafters: dict[str, list[str]] = field(default_factory=dict)
    drafter_env: dict[str, str] = field(default_factory=dict)   # extra environment of the drafter processes
    coordinator_args: list[str] = field(default_factory=list)
    verifier_count: int = 1
    verifier_python: str | None = None       # the verifiers' interpreter (a vLLM verifier: .venv-vllm's)
    # More verifiers after those, each (args, interpreter or None): a pool of different backends.
    extra_verifiers: list[tuple[list[str], str | None]] = field(default_factory=list)
    link: LinkProfile | None = None          # emulated edge-cloud link in front of every verifier
    verifier_cpus: str | None = None
    edge_cpus: str | None = None
    services: list[Service] = field(default_factory=list)
    proxies: list[DelayProxy] = field(default_factory=list)

    def __enter__(self) -> "LocalCluster":
        try:
            self.verifiers = [self._start("services.verifier", self.verifier_args, f"verifier{i or ''}",
                                          self.verifier_cpus, python=self.verifier_python)
                              for i in range(self.verifier_count)]
            self.verifiers += [self._start("services.verifier", args, f"verifier{self.verifier_count + i}",
                                           self.verifier_cpus, python=python)
                               for i, (args, python) in enumerate(self.extra_verifiers)]
            self.verifier = self.verifiers[0]
            self.drafter = self._start("services.drafter", self.drafter_args, "drafter", self.edge_cpus,
                                       self.drafter_env)
            self.drafters = {"draft": self.drafter} | {
                name: self._start("services.drafter", args, f"drafter-{name}", self.edge_cpus, self.drafter_env)
                for name, args in self.extra_drafters.items()}
            drafter_flag = (self.drafter.address if not self.extra_drafters else
                            ",".join(f"{name}={service.address}" for name, service in self.drafters.items()))
            links = [v.address for v in self.verifiers]
            if self.link is not None:
                self.proxies = [DelayProxy(address, self.link).start() for address in links]
                links = [proxy.address for proxy in self.proxies]
            self.coordinator = self._start("services.coordinator", [
                "--verifier", ",".join(links), "--drafter", drafter_flag, *self.coordinator_args],
                "coordinator", self.edge_cpus)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, module: str, args: list[str], name: str, cpus: str | None,
               env: dict[str, str] | None = None, python: str | None = None) -> Service:
        service = start_service(module, args, self.log_dir, name, cpus=cpus, env=env, python=python)
        service.module, service.args, service.cpus, service.env = module, args, cpus, env
        service.python = python
        self.services.append(service)
        return service

    def kill(self, service: Service, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: no drain, no goodbye) and reap the process."""
        service.process.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            service.process.wait()

    def restart(self, service: Service) -> None:
        """Start a killed service again on its old address (clients reconnect to the same port)."""
        if service.process.poll() is None:
            raise RuntimeError(f"{service.name} is still running")
        port = int(service.address.rsplit(":", 1)[1])
        fresh = start_service(service.module, service.args, self.log_dir, service.name, port=port, cpus=service.cpus,
                              env=service.env, python=service.python)
        service.process = fresh.process

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        for service in self.services:      # all drain at once: teardown costs one grace period, not one each
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        for service in reversed(self.services):
            stop_service(service)
        self.services.clear()

    def exit_notes(self) -> list[str]:
        """One line for each service that has ended (none while all run)."""
        return [note for service in self.services if (note := service.exit_note())]

    def __exit__(self, *exc) -> None:
        self.stop()
