"""Progress bars on long work: drawn on a terminal, silent otherwise, and never in the way of the lines.

The benchmarks share bench.report.progress/track; model assembly (edgespec.backends.assets), prepare-models and
export-onnx draw their own tqdm bars. A terminal is faked with a StringIO that says it is one.
"""
from __future__ import annotations

import hashlib
import io
import logging
import sys

import pytest

from bench.report import progress, track
from edgespec.backends import assets


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Call it in the test body (pytest's capture sets sys.stdout/stderr again when the test starts):
    ``out, err = terminal()``."""
    def install() -> tuple[Terminal, Terminal]:
        out, err = Terminal(), Terminal()
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", err)
        return out, err
    return install


def test_no_bar_when_stderr_is_not_a_terminal(capsys):
    with progress(3, "bench-x") as bar:
        assert bar.disable
        print("row 1")
        bar.update(1)
    captured = capsys.readouterr()
    assert captured.out == "row 1\n" and captured.err == ""


def test_on_a_terminal_lines_go_above_the_bar(terminal):
    out, err = terminal()
    handler = logging.StreamHandler(err)
    logger = logging.getLogger("test-progress")
    logger.addHandler(handler)
    try:
        with progress(4, "bench-x", unit="session") as bar:
            assert not bar.disable
            assert sys.stdout is not out and sys.stderr is not err   # wrapped while the bar draws
            print("row 1", flush=True)
            print("part", end="")
            print(" of a line")
            logger.warning("a log line")
            bar.update(2)
        assert sys.stdout is out and sys.stderr is err
        assert handler.stream is err
    finally:
        logger.removeHandler(handler)
    assert out.getvalue() == "row 1\npart of a line\n"          # whole lines, in order, nothing lost
    drawn = err.getvalue()
    assert "a log line\n" in drawn
    assert "bench-x" in drawn and "2/4" in drawn and "session" in drawn   # done / total with the unit
    assert "<" in drawn.rsplit("bench-x", 1)[1]                          # elapsed<remaining: the ETA


def test_track_yields_every_item_and_counts_them(terminal):
    _, err = terminal()
    assert list(track(["a", "b", "c"], "prompts")) == ["a", "b", "c"]
    assert "3/3" in err.getvalue()
    assert list(track(iter(range(5)), "gen")) == [0, 1, 2, 3, 4]          # no len(): counted first
    assert sys.stderr is err


def test_nested_bars_do_not_wrap_the_streams_twice(terminal):
    out, _ = terminal()
    with progress(2, "outer") as outer, progress(3, "inner") as inner:
        print("inside")
        inner.update(3)
        outer.update(1)
    assert sys.stdout is out and out.getvalue() == "inside\n"


def _fake_model(tmp_path, monkeypatch, parts: list[bytes]) -> assets.PackagedModel:
    paths = []
    for i, data in enumerate(parts, 1):
        paths.append(tmp_path / f"part{i:02d}.bin")
        paths[-1].write_bytes(data)
    monkeypatch.setattr(assets, "chunk_paths", lambda model: paths)
    return assets.PackagedModel(name="fake", description="a fake model", package_prefix="fake_part",
                                pip_prefix="fake-part", version="1", parts=len(parts),
                                sha256=hashlib.sha256(b"".join(parts)).hexdigest())


def test_assembly_shows_bytes_and_chunks_on_a_terminal(tmp_path, monkeypatch, terminal):
    _, err = terminal()
    parts = [b"x" * (5 << 20), b"y" * 1000]                  # more than one 4 MiB block in the first chunk
    model = _fake_model(tmp_path, monkeypatch, parts)
    out = assets.assemble_gguf(model, tmp_path / "out")
    assert out.read_bytes() == b"".join(parts)
    drawn = err.getvalue()
    assert "assembling fake" in drawn and "chunk 2/2" in drawn and "100%" in drawn
    assert "MB/s" in drawn or "kB/s" in drawn or "B/s" in drawn          # a rate


def test_assembly_is_silent_without_a_terminal(tmp_path, monkeypatch, capsys):
    model = _fake_model(tmp_path, monkeypatch, [b"abc", b"def"])
    assert assets.assemble_gguf(model, tmp_path / "out").read_bytes() == b"abcdef"
    assert capsys.readouterr().err == ""
    bad = assets.PackagedModel(**{**{f: getattr(model, f) for f in model.__dataclass_fields__}, "sha256": "0" * 64})
    with pytest.raises(assets.ModelAssetError, match="sha256"):
        assets.assemble_gguf(bad, tmp_path / "bad")
    assert not (tmp_path / "bad" / "model.partial").exists()


def test_prepare_models_counts_models_and_keeps_its_lines(monkeypatch, terminal, tmp_path):
    from edgespec.ops import prepare

    out, err = terminal()
    monkeypatch.setattr(prepare, "ensure_model_dir", lambda which: tmp_path / which)
    monkeypatch.setattr(sys, "argv", ["edgespec prepare-models", "draft", "target"])
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    prepare.main()
    assert out.getvalue().splitlines() == [f"draft: {tmp_path / 'draft'}", f"target: {tmp_path / 'target'}"]
    assert "prepare-models" in err.getvalue() and "2/2" in err.getvalue()


def test_prepare_models_without_a_terminal_prints_only_its_lines(monkeypatch, capsys, tmp_path):
    from edgespec.ops import prepare

    monkeypatch.setattr(prepare, "ensure_model_dir", lambda which: tmp_path / which)
    monkeypatch.setattr(sys, "argv", ["edgespec prepare-models", "draft"])
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    prepare.main()
    captured = capsys.readouterr()
    assert captured.out == f"draft: {tmp_path / 'draft'}\n"
    assert "prepare-models" not in captured.err and "%" not in captured.err


def test_export_onnx_counts_its_steps(monkeypatch, terminal, tmp_path):
    pytest.importorskip("torch")
    from edgespec.ops import export_onnx

    out, err = terminal()

    def fake_export(spec, out_dir, int8=False, step=export_onnx._no_step):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "model.onnx").write_bytes(b"onnx")
        for name in ("loaded", "traced", "written", *(["quantized"] if int8 else [])):
            export_onnx._say(f"{name} ...")
            step(name)
        return {"num_layers": 2, "vocab_size": 10, "quantization": "int8" if int8 else "none"}

    monkeypatch.setattr(export_onnx, "export", fake_export)
    assert export_onnx.main(["tiny:1", str(tmp_path / "onnx"), "--int8"]) == 0
    assert out.getvalue().splitlines()[:4] == ["loaded ...", "traced ...", "written ...", "quantized ..."]
    assert "exported tiny:1" in out.getvalue()
    assert "4/4 steps" in err.getvalue() and "quantized" in err.getvalue()


def test_prepare_models_quiets_other_bars_in_a_log(tmp_path):
    """Without a terminal, prepare-models sets TQDM_DISABLE before tqdm is first imported, so bars that are not
    its own (transformers' GGUF conversion) stay out of container and CI logs too."""
    import os
    import subprocess
    from pathlib import Path

    script = ("import sys; from edgespec.ops import prepare\n"
              "assert 'tqdm' not in sys.modules, 'imported before prepare could set TQDM_DISABLE'\n"
              "prepare.ensure_model_dir = lambda which: which\n"
              "sys.argv = ['prepare', 'draft']; prepare.main()\n"
              "from tqdm import tqdm; bar = tqdm(total=1); print('bar disabled:', bar.disable)\n")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root,
                          env={**env, "EDGESPEC_CACHE": str(tmp_path), "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["draft: draft", "bar disabled: True"]
    assert "%|" not in done.stderr
