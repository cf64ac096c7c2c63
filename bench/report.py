"""Small helpers the benchmark tools share."""
from __future__ import annotations

from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by nearest rank; 0 for no values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def process_memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak since start) of a process, MiB, from /proc/PID/status."""
    memory = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            memory[name] = round(int(value.split()[0]) / 1024, 1)
    return {"rss_mib": memory["VmRSS"], "hwm_mib": memory["VmHWM"]}
