"""Small helpers the benchmark tools share."""
from __future__ import annotations

import io
import json
import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator


def process_memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak since start) of a process, MiB, from /proc/PID/status."""
    memory = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            memory[name] = round(int(value.split()[0]) / 1024, 1)
    return {"rss_mib": memory["VmRSS"], "hwm_mib": memory["VmHWM"]}


class _AboveBar(io.TextIOBase):
    """A text stream that prints whole lines above the progress bars: it clears them, writes, redraws them."""

    def __init__(self, stream, bar):
        self.stream, self.bar, self.pending = stream, bar, ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            lines, _, self.pending = self.pending.rpartition("\n")
            with self.bar.get_lock():
                bars = [bar for bar in getattr(type(self.bar), "_instances", [self.bar]) if not bar.disable]
                for bar in bars:
                    bar.clear(nolock=True)
                self.stream.write(lines + "\n")
                self.stream.flush()
                for bar in bars:
                    bar.refresh(nolock=True)
        return len(text)

    def flush(self) -> None:     # a partial line waits for its end (or the bar's)
        self.stream.flush()

    def release(self) -> None:
        if self.pending:
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()


@contextmanager
def progress(total: float | None, desc: str, unit: str = "prompt", **options) -> Iterator:
    """A tqdm bar on stderr (done / total, elapsed, rate, ETA) that draws only when stderr is a terminal
    (``disable=None``). While it draws, the benchmark's own lines (print to stdout or stderr, logging) go above
    it instead of through it. ``bar.update(n)`` after each unit of work; nothing it does touches what is timed."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0   # no monitor thread waking up beside what the benchmark times
    terminal = sys.stderr.stream if isinstance(sys.stderr, _AboveBar) else sys.stderr   # an outer bar's wrapper
    bar = tqdm(total=total, desc=desc, unit=unit, disable=None, file=terminal, dynamic_ncols=True,
               smoothing=0.1, **options)
    if bar.disable or isinstance(sys.stdout, _AboveBar):   # not a terminal, or a bar already owns the streams
        try:
            yield bar
        finally:
            bar.close()
        return
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _AboveBar(out, bar), _AboveBar(err, bar)
    handlers = [(h, h.stream) for h in _stream_handlers() if h.stream in (out, err)]
    for handler, stream in handlers:
        handler.setStream(sys.stdout if stream is out else sys.stderr)
    try:
        yield bar
    finally:
        for handler, stream in handlers:
            handler.setStream(stream)
        wrapped = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        bar.close()
        for stream in wrapped:
            if isinstance(stream, _AboveBar):
                stream.release()


def track(items: Iterable, desc: str, unit: str = "prompt", total: int | None = None) -> Iterator:
    """``items`` with a progress bar (see progress): ``for x in track(prompts, "bench"): ...``."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    with progress(len(items) if total is None else total, desc, unit) as bar:
        for item in items:
            yield item
            bar.update(1)


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    return [h for logger in loggers for h in logger.handlers
            if type(h) is logging.StreamHandler]   # not FileHandler (a StreamHandler subclass)


def write_report(result: dict, markdown: str, json_path: Path | str | None, md_path: Path | str | None = None) -> None:
    """The table on stdout; with ``json_path``, the result as JSON there; the table as markdown at ``md_path``, or
    beside the JSON (.md) when none is given."""
    print(markdown)
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1))
    md = Path(md_path) if md_path is not None else json_path.with_suffix(".md") if json_path is not None else None
    if md is not None:
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(markdown.rstrip("\n") + "\n")
