"""`edgespec bench serve`'s reading of `vllm bench serve` results, its ratios and its table, on the results a real
smoke run saved (tests/unit/data/bench_serve_smoke.json); its prompts, client arguments and flags; and a server
that cannot start; the client itself against a server that closes its connections as llama-server does."""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from bench.bench_serve import (SYSTEMS, add_comparisons, build_parser, client_args, edgespec_layout, markdown,
                               merge_results, parse_args, run_client, spec_bench_subset, summarise_run)
from bench.serving import ServerFailed, start_http_server

ROOT = Path(__file__).resolve().parents[2]
SMOKE = json.loads((Path(__file__).parent / "data" / "bench_serve_smoke.json").read_text())


def smoke_rows() -> list[dict]:
    rows = [summarise_run(run["system"], run["concurrency"], run["result"]) for run in SMOKE["runs"]]
    add_comparisons(rows)
    return rows


def row_of(rows: list[dict], system: str, concurrency: int) -> dict:
    return next(r for r in rows if r["system"] == system and r["concurrency"] == concurrency)


def test_a_row_is_what_the_client_saved():
    raw = next(run["result"] for run in SMOKE["runs"] if run["system"] == "edgespec" and run["concurrency"] == 2)
    row = summarise_run("edgespec", 2, raw)
    assert row["output_tok_s"] == raw["output_throughput"] and row["output_tokens"] == 32
    assert row["ttft_p50_ms"] == raw["p50_ttft_ms"] and row["ttft_p99_ms"] == raw["p99_ttft_ms"]
    assert row["tpot_p50_ms"] == raw["p50_tpot_ms"] and row["itl_p99_ms"] == raw["p99_itl_ms"]
    assert row["completed"] == 2 and row["failed"] == 0 and row["tokens_per_request"] == 16.0
    assert row["texts"] == raw["generated_texts"] and "first_error" not in row


def test_repeated_runs_merge_as_one_run_of_all_their_requests():
    one = next(run["result"] for run in SMOKE["runs"] if run["system"] == "edgespec" and run["concurrency"] == 2)
    assert merge_results([one]) is one
    slower = dict(one, duration=2 * one["duration"], output_throughput=one["output_throughput"] / 2,
                  ttfts=[2 * t for t in one["ttfts"]], latencies=[2 * t for t in one["latencies"]],
                  itls=[[2 * g for g in gaps] for gaps in one["itls"]])
    row = summarise_run("edgespec", 2, merge_results([one, slower]))
    assert row["completed"] == 4 and row["output_tokens"] == 64 and row["prompts"] == 4
    assert row["output_tok_s"] == pytest.approx(64 / (3 * one["duration"]))     # tokens over time, not a mean of rates
    assert row["output_tok_s_runs"] == [one["output_throughput"], one["output_throughput"] / 2]
    assert row["ttft_p50_ms"] == pytest.approx(1000 * float(np.percentile(one["ttfts"] + slower["ttfts"], 50)))
    tpots = [(lat - t) / (n - 1) for r in (one, slower) for t, lat, n in zip(r["ttfts"], r["latencies"], r["output_lens"])]
    assert row["tpot_p99_ms"] == pytest.approx(1000 * float(np.percentile(tpots, 99)))
    assert row["acceptance"] == pytest.approx(4 / 9) and row["accepted_per_draft"] == 1.5   # counters summed
    assert row["texts"] == one["generated_texts"] * 2


def test_draft_acceptance_comes_from_the_servers_spec_decode_counters():
    rows = smoke_rows()
    assert row_of(rows, "edgespec", 2)["acceptance"] == pytest.approx(4 / 9)      # 4 of 9 drafted tokens
    assert row_of(rows, "edgespec", 2)["accepted_per_draft"] == 1.5
    assert row_of(rows, "edgespec", 1)["acceptance"] == 0.0                       # 1 drafted, none accepted
    assert row_of(rows, "edgespec-w0", 1)["acceptance"] is None                   # nothing drafted: no figure
    assert row_of(rows, "llama-server-spec", 1)["acceptance"] is None             # no vllm:spec_decode_* counters


def test_ratios_are_to_llama_server_and_window_0_at_the_same_concurrency():
    rows = smoke_rows()
    for concurrency in (1, 2):
        edgespec, llama, w0 = (row_of(rows, s, concurrency) for s in ("edgespec", "llama-server", "edgespec-w0"))
        assert edgespec["vs_llama_server"]["output_tok_s"] == edgespec["output_tok_s"] / llama["output_tok_s"]
        assert edgespec["vs_edgespec_w0"]["output_tok_s"] == edgespec["output_tok_s"] / w0["output_tok_s"]
        assert edgespec["vs_edgespec_w0"]["tpot_p50"] == edgespec["tpot_p50_ms"] / w0["tpot_p50_ms"]
        assert edgespec["vs_llama_server"]["ttft_p50"] == edgespec["ttft_p50_ms"] / llama["ttft_p50_ms"]
        assert llama["vs_llama_server"] == {"output_tok_s": 1.0, "ttft_p50": 1.0, "tpot_p50": 1.0}
    # the smoke run's own numbers (2 busy CPUs: noise, but these are what it saved)
    assert row_of(rows, "edgespec", 1)["vs_edgespec_w0"]["output_tok_s"] == pytest.approx(1.1384, abs=1e-4)
    assert row_of(rows, "edgespec-w0", 2)["vs_llama_server"]["output_tok_s"] == pytest.approx(1.5808, abs=1e-4)


def test_texts_are_compared_with_the_baselines_prompt_by_prompt():
    rows = smoke_rows()
    assert row_of(rows, "edgespec", 1)["same_text_as_edgespec_w0"] == 2
    assert row_of(rows, "llama-server", 1)["same_text_as_edgespec_w0"] == 2
    assert row_of(rows, "llama-server-spec", 1)["same_text_as_edgespec_w0"] == 1   # llama.cpp's own drafting
    assert row_of(rows, "vllm", 2)["same_text_as_llama_server"] == 1               # bfloat16, not the GGUF


def test_a_run_without_its_baseline_gets_no_ratio():
    rows = [summarise_run(run["system"], run["concurrency"], run["result"]) for run in SMOKE["runs"]
            if run["system"] != "llama-server"]
    add_comparisons(rows)
    assert all("vs_llama_server" not in r and "vs_edgespec_w0" in r for r in rows)


def test_the_table_has_a_row_per_run_ordered_by_concurrency_then_system():
    rows = smoke_rows()
    report = {"date": "2026-12-03", "machine": "m", "prompts": 2, "categories": "2 categories", "tokens": 16,
              "ignore_eos": False, "client": "0.32.0", "systems": list(SYSTEMS), "servers": {"llama-server": "s"},
              "skipped": {"vllm": "why"}, "command": "edgespec bench serve", "rows": rows}
    table = markdown(report).splitlines()
    ran = [s for s in SYSTEMS if any(row["system"] == s for row in rows)]
    first = [line for line in table if line.startswith("| ") and "| system |" not in line][:2 * len(ran)]
    assert [(line.split(" | ")[0][2:], int(line.split(" | ")[1])) for line in first] == [
        (s, c) for c in (1, 2) for s in ran]
    edgespec = next(line for line in first if line.startswith("| edgespec | 1 |"))
    assert edgespec.startswith("| edgespec | 1 | 6.1 | 3.13x | 1.14x | 1577 / 1701 | 69 / 71 |")
    assert "- vllm: skipped, why" in table


def test_a_failed_run_is_a_row_that_says_so():
    rows = [*smoke_rows(), {"system": "vllm", "concurrency": 4, "completed": 0,
                            "error": "vllm bench serve exited with 1 (log: x)\nTraceback"}]
    add_comparisons(rows)
    report = {"date": "d", "machine": "m", "prompts": 2, "categories": "c", "tokens": 16, "ignore_eos": False,
              "client": "v", "servers": {}, "command": "c", "rows": rows}
    assert "| vllm | 4 | failed: vllm bench serve exited with 1 (log: x) |" in markdown(report)


def test_a_nan_baseline_gives_no_ratio():
    rows = smoke_rows()
    row_of(rows, "llama-server", 1)["tpot_p50_ms"] = float("nan")
    add_comparisons(rows)
    assert math.isnan(row_of(rows, "edgespec", 1)["vs_llama_server"]["tpot_p50"])


def test_the_subset_goes_round_robin_over_spec_bench_categories():
    picked = spec_bench_subset(ROOT / "data" / "spec_bench" / "question.jsonl", 26)
    categories = [c for c, _ in picked]
    assert len(set(categories[:13])) == 13 and categories[13:] == categories[:13]
    assert picked[0] == ("writing", "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
                                    "cultural experiences and must-see attractions.")


def test_window_0_rides_in_the_request_body_and_ignore_eos_only_when_asked(tmp_path):
    args = client_args("http://127.0.0.1:1", "edgespec-w0", SYSTEMS["edgespec-w0"].extra_body, tmp_path / "p.jsonl",
                       2, 16, 4, tmp_path, tmp_path / "r.json", ignore_eos=False)
    assert json.loads(args[args.index("--extra-body") + 1]) == {"edgespec": {"window": 0}}
    assert args[args.index("--max-concurrency") + 1] == "4" and args[args.index("--temperature") + 1] == "0"
    assert args[args.index("--backend") + 1] == "openai-chat" and "--skip-chat-template" in args
    assert "--ignore-eos" not in args
    plain = client_args("u", "edgespec", {}, tmp_path, 2, 16, 1, tmp_path, tmp_path / "r.json", ignore_eos=True)
    assert "--extra-body" not in plain and plain[-1] == "--ignore-eos"
    from edgespec.api.openai_compat import OpenAIRequest   # edgespec honours it where its API reads it

    takes = "ignore_eos" in OpenAIRequest.__dataclass_fields__
    assert SYSTEMS["edgespec"].honours_ignore_eos is takes and SYSTEMS["edgespec-w0"].honours_ignore_eos is takes
    assert SYSTEMS["llama-server"].honours_ignore_eos and SYSTEMS["vllm"].honours_ignore_eos


def test_flags_are_checked():
    assert parse_args(["--concurrency", "16,1,4"]).levels == [1, 4, 16]
    assert parse_args(["--systems", "all"]).names == list(SYSTEMS)
    for wrong in (["--systems", "llama"], ["--concurrency", "0"], ["--concurrency", "a"], ["--subset", "0"],
                  ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)


def test_every_flag_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    flags = [o for action in build_parser()._actions for o in action.option_strings if o.startswith("--")]
    missing = [f for f in flags if f != "--help" and f"{f} " not in readme and f"`{f}" not in readme]
    assert len(flags) > 8 and not missing, f"bench serve flags not in README.md: {missing}"


def test_a_server_that_cannot_start_says_how_it_ended_and_shows_its_log(tmp_path):
    command = [sys.executable, "-c", "print('error: failed to load model x.gguf'); raise SystemExit(3)"]
    with pytest.raises(ServerFailed) as failed:
        start_http_server("llama-server", command, tmp_path, port=9, timeout_seconds=30, settings="")
    assert str(failed.value).startswith("llama-server exited with 3 while starting (log: ")
    assert "error: failed to load model x.gguf" in str(failed.value)


def test_the_plot_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.plots import plot_serve

    path = plot_serve({"rows": smoke_rows(), "prompts": 2, "tokens": 16}, tmp_path / "serve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


class ClosesAfterAStream(BaseHTTPRequestHandler):
    """An OpenAI chat stream answered as the vendored llama.cpp's llama-server answers it (measured with aiohttp:
    chunked, "Keep-Alive: timeout=5, max=100", and the connection closed a moment after the last chunk, so every
    second request on a kept connection failed at once with "Server disconnected")."""
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Keep-Alive", "timeout=5, max=100")
        self.end_headers()
        events = [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in ("Hello", " there")]
        events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        for data in [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]:
            self.wfile.write(f"{len(data):x}\r\n{data}\r\n".encode())
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        time.sleep(0.5)   # ... a moment after the answer ended: the client has sent its next request on it by then
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_the_client_gets_every_request_through_a_server_that_closes_after_a_stream(tmp_path):
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.skip("no vLLM environment (bash scripts/vllm_env.sh)")
    from edgespec.backends.convert import ensure_tokenizer_dir

    server = ThreadingHTTPServer(("127.0.0.1", 0), ClosesAfterAStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dataset = tmp_path / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": f"Say {word}."}) + "\n" for word in ("one", "two", "three",
                                                                                                 "four")))
        args = client_args(f"http://127.0.0.1:{server.server_port}", "llama-server", {}, dataset, 4, 2, 1,
                           ensure_tokenizer_dir("smollm2"), tmp_path / "result.json", True)
        result = run_client(python, args, tmp_path / "client.log", 600)
    finally:
        server.shutdown()
    assert (result["completed"], result["failed"]) == (4, 0), (tmp_path / "client.log").read_text()[-2000:]


def test_the_exact_off_services_differ_from_the_default_ones_in_the_verifiers_exact_flag_only():
    for placement in ("one-host", "split"):
        exact, inexact = (edgespec_layout(server, placement, 16) for server in ("edgespec", "edgespec-exact-off"))
        flags = inexact["verifier_args"]
        assert flags[flags.index("--exact") + 1] == "off" and flags.count("--exact") == 1
        assert [f for f in flags if f not in ("--exact", "off")] == \
            [f for f in exact["verifier_args"] if f not in ("--exact", "on")]
        assert {k: v for k, v in inexact.items() if k != "verifier_args"} == \
            {k: v for k, v in exact.items() if k != "verifier_args"}
        assert flags[flags.index("--max-sequences") + 1] == "16"


def test_rows_of_the_exact_off_services_get_their_own_window_0_as_a_baseline():
    renamed = {"edgespec": "edgespec-exact-off", "edgespec-w0": "edgespec-exact-off-w0"}
    runs = [run for run in SMOKE["runs"] if run["system"] in ("edgespec", "edgespec-w0", "llama-server")]
    rows = [summarise_run(run["system"], run["concurrency"], run["result"]) for run in runs]
    rows += [summarise_run(renamed[run["system"]], run["concurrency"], run["result"])
             for run in runs if run["system"] in renamed]
    add_comparisons(rows)
    inexact, inexact_w0 = row_of(rows, "edgespec-exact-off", 1), row_of(rows, "edgespec-exact-off-w0", 1)
    assert inexact["vs_edgespec_exact_off_w0"]["output_tok_s"] == \
        inexact["output_tok_s"] / inexact_w0["output_tok_s"]
    report = {"date": "d", "machine": "m", "prompts": 2, "categories": "c", "tokens": 16, "ignore_eos": False,
              "client": "0.32.0", "systems": list(SYSTEMS), "servers": {}, "skipped": {}, "command": "c",
              "rows": rows}
    header = next(line for line in markdown(report).splitlines() if line.startswith("| system | C | output"))
    assert header.endswith("| vs window 0, exact off |")


def test_the_exact_off_services_run_when_asked_for_by_name_or_by_all():
    assert "edgespec-exact-off" not in parse_args([]).names
    assert {"edgespec", "edgespec-w0", "llama-server", "llama-server-spec", "vllm"} <= set(parse_args([]).names)
    assert "edgespec-exact-off-w0" in parse_args(["--systems", "all"]).names
    assert parse_args(["--systems", "edgespec-exact-off"]).names == ["edgespec-exact-off"]
