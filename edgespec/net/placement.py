"""Where a service runs (its Info's Placement): the machine and the CPUs the process may use.

A coordinator compares its drafter's with its verifier's (edgespec.loop.generation): a drafter on the verifier's
CPUs takes the verifier's time while it drafts (edgespec.control.telemetry prices that under load)."""
from __future__ import annotations

import os
import socket

from edgespec.v1 import common_pb2


def here() -> common_pb2.Placement:
    """This process's placement: hostname and CPU affinity."""
    return common_pb2.Placement(host=socket.gethostname(), cpus=sorted(os.sched_getaffinity(0)))

