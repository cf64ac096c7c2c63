"""The coordinator's OpenAI-compatible HTTP API (--http-port) on a real cluster of tiny models: the official
`openai` client (whole and streamed), raw HTTP for the errors, auth, stops, usage, and a client that goes away."""
import asyncio
import json
import re
import subprocess
import time
import urllib.request

import grpc
import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.cluster import REPO_ROOT, LocalCluster, start_service, stop_service
from edge_client.client import generate
from edgespec.backends.registry import TINY_EOS
from edgespec.backends.tokenizer import ByteTokenizer
from edgespec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.tiny import target_only_greedy_eos, tiny

TARGET, DRAFT = "tiny:7", "tiny:7~1"
PROMPTS = ["def add(a, b):", "Speculative decoding is"]
MAX_NEW = 300
API_AT = re.compile(r"OpenAI-compatible API on (http://\S+)/v1")
METRICS_AT = re.compile(r"metrics on (http://\S+/metrics)")
TIMEOUT = 120


def api_url(service) -> str:
    return API_AT.findall(service.log_path.read_text())[-1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("logs"),
                      verifier_args=["--model", TARGET, "--max-window", "8", "--metrics-port", "0"],
                      drafter_args=["--model", DRAFT, "--max-window", "8"],
                      coordinator_args=["--tokenizer", "bytes", "--max-window", "8", "--max-new-tokens", str(MAX_NEW),
                                        "--http-port", "0"]) as running:
        running.url = api_url(running.coordinator)
        running.metrics = METRICS_AT.findall(running.verifier.log_path.read_text())[-1]
        yield running


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def grpc_generation(cluster, prompt, max_new, window=-1, chat=True, **options):
    """(text, chunk texts, stats) of the gRPC Generate."""
    async def go():
        texts, stats = [], None
        async for event in generate(cluster.coordinator.address, prompt, max_new, window, chat=chat,
                                    timeout_seconds=TIMEOUT, **options):
            if event.HasField("chunk"):
                texts.append(event.chunk.text)
            else:
                stats = event.stats
        return "".join(texts), texts, stats
    return asyncio.run(go())


def open_sessions(cluster) -> float:
    text = urllib.request.urlopen(cluster.metrics, timeout=30).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "edgespec_verifier_open_sessions":
                return sample.value
    return 0.0


def wait_no_sessions(cluster, seconds=30.0) -> float:
    deadline = time.monotonic() + seconds
    while (value := open_sessions(cluster)) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def chat_args(prompt, max_tokens, **extra):
    return dict(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
                **extra)


def streamed(stream):
    """(text, finish_reason, the edgespec stats, usage) of a streamed chat completion."""
    text, finish, stats, usage = [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = getattr(choice, "delta", None)
            text.append((delta.content if delta is not None else choice.text) or "")
            if choice.finish_reason is not None:
                finish = choice.finish_reason
                stats = chunk.model_extra["edgespec"]
    return "".join(text), finish, stats, usage


@pytest.mark.parametrize("window", [-1, 3])
def test_chat_whole_and_streamed_equal_grpc_generate_under_greedy(cluster, client, window):
    for prompt in PROMPTS:
        expected, _, stats = grpc_generation(cluster, prompt, 40, window)
        whole = client.chat.completions.create(**chat_args(prompt, 40, extra_body={"edgespec": {"window": window}}))
        assert whole.choices[0].message.content == expected
        assert whole.choices[0].message.role == "assistant"
        assert whole.choices[0].finish_reason == {"eos": "stop", "length": "length"}[stats.finish_reason]
        assert whole.usage.prompt_tokens == stats.prompt_tokens == len(prompt.encode())
        assert whole.usage.completion_tokens == stats.new_tokens
        assert whole.usage.total_tokens == stats.prompt_tokens + stats.new_tokens
        extension = whole.model_extra["edgespec"]
        assert extension["verification"] == "greedy" and extension["new_tokens"] == stats.new_tokens
        assert extension["accepted_tokens"] + extension["rounds"] == stats.new_tokens
        text, finish, stream_stats, usage = streamed(client.chat.completions.create(
            **chat_args(prompt, 40, extra_body={"edgespec": {"window": window}}), stream=True,
            stream_options={"include_usage": True}))
        assert text == expected
        assert finish == whole.choices[0].finish_reason
        assert stream_stats["new_tokens"] == stats.new_tokens
        assert (usage.prompt_tokens, usage.completion_tokens) == (stats.prompt_tokens, stats.new_tokens)


def test_completions_whole_and_streamed_equal_grpc_generate(cluster, client):
    prompt = PROMPTS[0]
    expected, _, stats = grpc_generation(cluster, prompt, 30, chat=False)
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0)
    assert whole.choices[0].text == expected
    assert whole.object == "text_completion"
    assert whole.usage.completion_tokens == stats.new_tokens
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=30, temperature=0, stream=True) if c.choices)
    assert text == expected


def test_system_and_assistant_turns_go_through_the_transcript(cluster, client):
    """The byte tokenizer has no chat template: several turns are a plain transcript, the same over both APIs."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]
    transcript = "system: Be brief.\nuser: Hi\nassistant: Hello.\nuser: 2+2?\nassistant:"
    expected, _, stats = grpc_generation(cluster, transcript, 20, chat=False)
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert whole.choices[0].message.content == expected
    assert whole.usage.prompt_tokens == len(transcript.encode())


def test_models_and_health(cluster, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [TARGET]
    health = httpx.get(cluster.url + "/health", timeout=TIMEOUT)
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_max_tokens_is_finish_reason_length(cluster, client):
    whole = client.chat.completions.create(**chat_args(PROMPTS[1], 7))
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 7
    whole = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[1]}],
                                           max_completion_tokens=5, temperature=0)
    assert whole.usage.completion_tokens == 5


def boundary_stop(chunks: list[str]) -> tuple[str, str]:
    """A stop sequence made of the end of one chunk's text and the start of the next, found nowhere earlier;
    and the text before it."""
    text = "".join(chunks)
    at = 0
    for left, right in zip(chunks, chunks[1:]):
        at += len(left)
        for a, b in ((2, 2), (2, 1), (1, 2), (1, 1)):
            if len(left) < a or len(right) < b:
                continue
            stop = left[-a:] + right[:b]
            if "\ufffd" not in stop and text.find(stop) == at - a:
                return stop, text[:at - a]
    raise AssertionError(f"no usable chunk boundary in {chunks!r}")


def test_stop_sequence_across_a_chunk_boundary_is_cut_exactly(cluster, client):
    prompt = PROMPTS[0]
    full, chunks, full_stats = grpc_generation(cluster, prompt, 120, window=4)
    stop, before = boundary_stop(chunks)
    # gRPC: the stop field.
    text, stop_chunks, stats = grpc_generation(cluster, prompt, 120, window=4, stop=["never-there", stop])
    assert text == before and stop not in text
    assert (stats.finish_reason, stats.stop_sequence) == ("stop", stop)
    assert stats.new_tokens < full_stats.new_tokens
    # HTTP, whole and streamed.
    args = chat_args(prompt, 120, stop=["never-there", stop], extra_body={"edgespec": {"window": 4}})
    whole = client.chat.completions.create(**args)
    assert whole.choices[0].message.content == before
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens == stats.new_tokens
    assert whole.model_extra["edgespec"]["stop_sequence"] == stop
    text, finish, extension, _ = streamed(client.chat.completions.create(**args, stream=True))
    assert (text, finish, extension["stop_sequence"]) == (before, "stop", stop)
    # A single string works too, on the completions endpoint.
    completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=120, temperature=0, stop=stop,
                                           extra_body={"edgespec": {"window": 4}})
    assert (completion.choices[0].text, completion.choices[0].finish_reason) == (before, "stop")
    assert wait_no_sessions(cluster) == 0


EOS_PROMPT = "The cat"   # the target's greedy continuation ends with EOS at its 34th token


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_min_tokens_and_ignore_eos_give_the_targets_own_output(cluster, client, endpoint):
    """vLLM's meaning: min_tokens masks EOS for that many tokens, ignore_eos runs past EOS to max_tokens; the text
    is the target's own (greedy) decoding with that rule, whatever the windows."""
    def run(**extra):
        if endpoint == "chat":
            whole = client.chat.completions.create(**chat_args(EOS_PROMPT, 48, extra_body=extra))
            return whole.choices[0].message.content, whole.choices[0].finish_reason, whole.usage.completion_tokens
        whole = client.completions.create(model="tiny", prompt=EOS_PROMPT, max_tokens=48, temperature=0,
                                          extra_body=extra)
        return whole.choices[0].text, whole.choices[0].finish_reason, whole.usage.completion_tokens

    def expected(**rule):
        tokens = target_only_greedy_eos(TARGET, tuple(EOS_PROMPT.encode()), 48, **rule)
        ended = tokens[-1] == TINY_EOS and not rule.get("ignore_eos")
        return ByteTokenizer().decode(tokens), "stop" if ended else "length", len(tokens)

    assert run() == expected() and expected()[1:] == ("stop", 34)
    for window in (0, 3):
        options = {"edgespec": {"window": window}}
        assert run(min_tokens=40, **options) == expected(min_tokens=40)
        assert run(ignore_eos=True, **options) == expected(ignore_eos=True)
        assert expected(ignore_eos=True)[1:] == ("length", 48)
    assert wait_no_sessions(cluster) == 0


def target_alone_logprobs(prompt: str, tokens):
    """[len(tokens), V]: the target alone over the prompt and ``tokens`` in one forward, log-softmax at T = 1."""
    import torch

    ids = list(prompt.encode())
    with torch.no_grad():
        logits = tiny(TARGET).model(torch.tensor([ids + list(tokens)])).logits[0, len(ids) - 1:-1]
    return torch.log_softmax(logits.double(), dim=-1)


def token_text(token: int) -> str:
    return ByteTokenizer().decode([token])


def test_chat_logprobs_are_the_targets_own_whole_and_streamed(cluster, client):
    tokens = target_only_greedy_eos(TARGET, tuple(PROMPTS[1].encode()), 30)
    reference = target_alone_logprobs(PROMPTS[1], tokens)
    args = chat_args(PROMPTS[1], 30, logprobs=True, top_logprobs=3, extra_body={"edgespec": {"window": 3}})
    whole = client.chat.completions.create(**args)
    content = whole.choices[0].logprobs.content
    assert len(content) == len(tokens) == whole.usage.completion_tokens
    for entry, token, row in zip(content, tokens, reference):
        assert (entry.token, entry.bytes) == (token_text(token), list(token_text(token).encode()))
        assert entry.logprob == pytest.approx(float(row[token]), abs=1e-4)
        values, ids = row.topk(3)
        assert [t.token for t in entry.top_logprobs] == [token_text(i) for i in ids.tolist()]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)
    streamed_content = [entry for chunk in client.chat.completions.create(**args, stream=True)
                        for choice in chunk.choices if choice.logprobs for entry in choice.logprobs.content]
    assert [e.model_dump() for e in streamed_content] == [e.model_dump() for e in content]


def test_completions_logprobs_whole_and_streamed(cluster, client):
    tokens = target_only_greedy_eos(TARGET, tuple(PROMPTS[0].encode()), 20)
    reference = target_alone_logprobs(PROMPTS[0], tokens)
    args = dict(model="tiny", prompt=PROMPTS[0], max_tokens=20, temperature=0, logprobs=2)
    whole = client.completions.create(**args).choices[0].logprobs
    assert whole.tokens == [token_text(t) for t in tokens]
    assert whole.token_logprobs == pytest.approx([float(row[t]) for row, t in zip(reference, tokens)], abs=1e-4)
    assert whole.text_offset == [sum(len(t) for t in whole.tokens[:i]) for i in range(len(tokens))]
    for top, token, row in zip(whole.top_logprobs, tokens, reference):
        values, ids = row.topk(2)
        assert top == pytest.approx({token_text(token): float(row[token]),
                                     **{token_text(i): v for i, v in zip(ids.tolist(), values.tolist())}}, abs=1e-4)
    streamed = [c.choices[0].logprobs for c in client.completions.create(**args, stream=True)
                if c.choices and c.choices[0].logprobs]
    assert [t for lp in streamed for t in lp.tokens] == whole.tokens
    assert [o for lp in streamed for o in lp.text_offset] == whole.text_offset
    # the adaptive windows may differ between the two runs: the same values, up to the forward shapes' rounding
    assert [v for lp in streamed for v in lp.token_logprobs] == pytest.approx(whole.token_logprobs, abs=1e-4)


def test_sampled_logprobs_over_grpc_are_the_targets_own_at_the_sampled_tokens(cluster):
    async def go():
        return [event.chunk async for event in generate(cluster.coordinator.address, PROMPTS[1], 30, 3, chat=False,
                                                        timeout_seconds=TIMEOUT, temperature=0.8, seed=5, logprobs=2)
                if event.HasField("chunk")]
    chunks = asyncio.run(go())
    tokens = [t for c in chunks for t in c.token_ids]
    entries = [e for c in chunks for e in c.logprobs]
    reference = target_alone_logprobs(PROMPTS[1], tokens)
    assert [e.token for e in entries] == tokens
    assert [e.logprob for e in entries] == pytest.approx([float(row[t]) for row, t in zip(reference, tokens)],
                                                         abs=1e-4)
    assert [list(e.top_ids) for e in entries] == [row.topk(2).indices.tolist() for row in reference]


def test_langchain_chat_openai_invoke_and_stream(cluster):
    """A second real client: LangChain's ChatOpenAI, whole and streamed, with log-probabilities and vLLM's
    parameters through its extra_body."""
    from langchain_openai import ChatOpenAI

    prompt = PROMPTS[1]
    expected, _, stats = grpc_generation(cluster, prompt, 40, 3)
    llm = ChatOpenAI(base_url=cluster.url + "/v1", api_key="unused", model="tiny", temperature=0, max_tokens=40,
                     timeout=TIMEOUT, max_retries=0, stream_usage=True, extra_body={"edgespec": {"window": 3}})
    reply = llm.invoke(prompt)
    assert reply.content == expected
    assert reply.usage_metadata["output_tokens"] == stats.new_tokens
    assert reply.response_metadata["finish_reason"] == {"eos": "stop", "length": "length"}[stats.finish_reason]
    chunks = list(llm.stream(prompt))
    assert "".join(chunk.content for chunk in chunks) == expected
    assert sum((chunk.usage_metadata or {}).get("output_tokens", 0) for chunk in chunks) == stats.new_tokens
    scored = llm.bind(logprobs=True, top_logprobs=2).invoke(prompt)
    assert len(scored.response_metadata["logprobs"]["content"]) == stats.new_tokens
    eos = ChatOpenAI(base_url=cluster.url + "/v1", api_key="unused", model="tiny", temperature=0, max_tokens=48,
                     timeout=TIMEOUT, max_retries=0, extra_body={"ignore_eos": True, "edgespec": {"window": 3}})
    assert eos.invoke(EOS_PROMPT).usage_metadata["output_tokens"] == 48
    assert "".join(chunk.content for chunk in eos.stream(EOS_PROMPT)) == ByteTokenizer().decode(
        target_only_greedy_eos(TARGET, tuple(EOS_PROMPT.encode()), 48, ignore_eos=True))


def post(cluster, path, body, headers=None, raw=None):
    return httpx.post(cluster.url + path, content=raw if raw is not None else json.dumps(body),
                      headers={"Content-Type": "application/json", **(headers or {})}, timeout=TIMEOUT)


GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.mark.parametrize("body,param", [
    ({**GOOD, "n": 2}, "n"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "temperature": 2.5}, "temperature"),
    ({**GOOD, "max_tokens": -1}, "max_tokens"),
    ({**GOOD, "max_tokens": "5"}, "max_tokens"),
    ({**GOOD, "max_tokens": MAX_NEW + 1}, "max_tokens"),
    ({**GOOD, "messages": []}, "messages"),
    ({**GOOD, "messages": "hi"}, "messages"),
    ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({**GOOD, "stop": 5}, "stop"),
    ({**GOOD, "stop": [""]}, "stop"),
    ({**GOOD, "logprobs": "yes"}, "logprobs"),
    ({**GOOD, "top_logprobs": 2}, "top_logprobs"),                 # without logprobs: true
    ({**GOOD, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({**GOOD, "seed": 1.5}, "seed"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "edgespec": {"window": 99}}, "edgespec.window"),
    ({**GOOD, "edgespec": {"windw": 2}}, "edgespec.windw"),
    ({**GOOD, "edgespec": {"relaxed": "bogus"}}, "edgespec.relaxed"),
    ({**GOOD, "ignore_eos": "yes"}, "ignore_eos"),
    ({**GOOD, "min_tokens": -1}, "min_tokens"),
    ({**GOOD, "min_tokens": 6}, "min_tokens"),                                   # above max_tokens
    ({"messages": GOOD["messages"], "min_tokens": MAX_NEW + 1}, "min_tokens"),   # above the server's budget
    ({**GOOD, "repetition_penalty": 1.3}, "repetition_penalty"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_invalid_requests_are_400_with_an_openai_error_and_change_nothing(cluster, body, param):
    for stream in (False, True):
        answer = post(cluster, "/v1/chat/completions", {**body, "stream": body.get("stream", stream)})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
        assert set(error) == {"message", "type", "param", "code"}
    assert wait_no_sessions(cluster) == 0


def verifier_info(cluster):
    async def go():
        async with grpc.aio.insecure_channel(cluster.verifier.address) as channel:
            return await verifier_pb2_grpc.VerifierStub(channel).Info(verifier_pb2.InfoRequest())
    return asyncio.run(go())


def test_tokenize_and_detokenize_as_vllm_answers_them(cluster):
    """vLLM's shapes: what `vllm bench serve` sends to align its prompts, and the chat form."""
    prompt = "Speculative decoding is"
    answer = post(cluster, "/tokenize", {"model": "tiny", "prompt": prompt, "add_special_tokens": False})
    assert answer.status_code == 200, answer.text
    limit = verifier_info(cluster).max_session_tokens
    assert answer.json() == {"count": len(prompt), "max_model_len": limit, "tokens": list(prompt.encode()),
                             "token_strs": None}
    tokens = answer.json()["tokens"]
    answer = post(cluster, "/detokenize", {"model": "tiny", "tokens": tokens[:11]})
    assert (answer.status_code, answer.json()) == (200, {"prompt": prompt[:11]})
    # The chat form: the tokens a chat completion's prompt has (usage.prompt_tokens), with the assistant's turn open.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    chat = post(cluster, "/tokenize", {"messages": messages}).json()
    whole = post(cluster, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()
    assert chat["count"] == whole["usage"]["prompt_tokens"] == len(chat["tokens"])
    assert bytes(chat["tokens"]).endswith(b"\nassistant:")
    closed = post(cluster, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
    assert chat["tokens"][:closed["count"]] == closed["tokens"] and closed["count"] < chat["count"]
    strs = post(cluster, "/tokenize", {"prompt": "hi", "return_token_strs": True}).json()
    assert strs["token_strs"] == ["h", "i"]
    for path, body, param in (("/tokenize", {"prompt": 3}, "prompt"), ("/tokenize", {"messages": []}, "messages"),
                              ("/detokenize", {"tokens": [1, 5000]}, "tokens"), ("/detokenize", {}, "tokens")):
        answer = post(cluster, path, body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
    assert post(cluster, "/tokenize", None, raw="{no").status_code == 400


def scrape_api(cluster) -> dict[tuple[str, tuple], float]:
    """GET /metrics on the API port as {(sample name, sorted labels): value}."""
    answer = httpx.get(cluster.url + "/metrics", timeout=TIMEOUT)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def test_metrics_on_the_api_port_count_the_generations_rounds_under_vllms_names(cluster, client):
    before = scrape_api(cluster)
    whole = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                      extra_body={"edgespec": {"window": 3}})
    stats, after = whole.model_extra["edgespec"], scrape_api(cluster)

    def delta(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)
    target_only = delta("edgespec_spec_decode_window_size_bucket", (("le", "0"),))
    assert delta("vllm:spec_decode_num_drafts_total") == stats["rounds"] - target_only > 0
    assert delta("vllm:spec_decode_num_draft_tokens_total") == stats["drafted_tokens"] > 0
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == stats["accepted_tokens"]
    per_position = {dict(labels)["position"]: delta(name, labels) for name, labels in after
                    if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
    assert sum(per_position.values()) == stats["accepted_tokens"]
    for (name, labels), value in after.items():   # the same counters, twice
        if name.startswith("vllm:"):
            assert after[("edgespec_" + name.removeprefix("vllm:"), labels)] == value


def test_vllm_bench_serves_own_client_code_works_against_the_api(cluster):
    """vLLM's request functions, spec-decode scrape and prompt alignment (tests/vllm_bench_client.py)."""
    python = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.skip("no vLLM environment (bash scripts/vllm_env.sh)")
    run = subprocess.run([str(python), "-m", "tests.vllm_bench_client", cluster.url, "tiny"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    expected = target_only_greedy_eos(TARGET, tuple(EOS_PROMPT.encode()), 48, ignore_eos=True)
    assert result["completions"] == {"generated_text": ByteTokenizer().decode(expected), "success": True,
                                     "output_tokens": 48, "error": ""}
    assert result["chat"]["success"] and result["chat"]["output_tokens"] == 8, result["chat"]
    before, after = result["before"], result["after"]
    assert after["num_drafts"] > before["num_drafts"] and after["num_draft_tokens"] > before["num_draft_tokens"]
    scraped = scrape_api(cluster)
    assert after["num_accepted_tokens"] == scraped[("vllm:spec_decode_num_accepted_tokens_total", ())]
    assert sum(after["accepted_per_pos"].values()) == after["num_accepted_tokens"]
    assert result["aligned"] == [["Specu", 5]]   # 20 tokens here, 5 as the benchmark counted: cut to 5 of ours


def test_bad_json_and_unknown_fields(cluster):
    answer = post(cluster, "/v1/chat/completions", None, raw="{not json")
    assert answer.status_code == 400 and "JSON" in answer.json()["error"]["message"]
    answer = post(cluster, "/v1/completions", {"model": "tiny", "prompt": ""})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "prompt"
    answer = post(cluster, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0,
                                                "some_future_field": {"x": 1}})   # ignored, as OpenAI does
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3


def test_client_gone_mid_stream_closes_the_sessions(cluster):
    log_before = len(cluster.drafter.log_path.read_text())
    body = {**GOOD, "max_tokens": MAX_NEW, "temperature": 0, "stream": True, "edgespec": {"window": 1},
            "messages": [{"role": "user", "content": PROMPTS[1]}]}
    session = None
    with httpx.stream("POST", cluster.url + "/v1/chat/completions", content=json.dumps(body),
                      headers={"Content-Type": "application/json"}, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                session = json.loads(line[len("data: "):])["id"].split("-", 1)[1]
                if json.loads(line[len("data: "):])["choices"][0]["delta"].get("content"):
                    break   # some text arrived: go away mid-stream
    assert session is not None
    assert wait_no_sessions(cluster) == 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        drafter_log = cluster.drafter.log_path.read_text()[log_before:]
        if f"session {session} closed" in drafter_log:
            break
        time.sleep(0.2)
    assert f"session {session} opened" in drafter_log and f"session {session} closed" in drafter_log
    coordinator_log = cluster.coordinator.log_path.read_text()
    assert f"session {session}: {MAX_NEW} tokens in" not in coordinator_log   # cancelled, not run to the end
    assert not re.search(rf"session {session}: \d+ tokens in", coordinator_log)


@pytest.fixture(scope="module")
def guarded(cluster, tmp_path_factory):
    """A second coordinator, with bearer tokens, in front of the same verifier and drafter."""
    folder = tmp_path_factory.mktemp("auth")
    tokens = folder / "tokens"
    tokens.write_text("alice s3cret-alice\n")
    service = start_service("services.coordinator", [
        "--verifier", cluster.verifier.address, "--drafter", cluster.drafter.address, "--tokenizer", "bytes",
        "--max-new-tokens", "50", "--auth-tokens", str(tokens), "--http-port", "0"], folder, "coordinator-auth")
    service.url = api_url(service)
    yield service
    stop_service(service)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-alice"}],
                         ids=["missing", "wrong", "not-bearer"])
def test_auth_missing_or_wrong_is_401(guarded, headers):
    for path, body in (("/v1/chat/completions", GOOD), ("/v1/completions", {"prompt": "hi", "max_tokens": 3}),
                       ("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [104]})):
        answer = post(guarded, path, body, headers)
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["type"] == "authentication_error"
    assert httpx.get(guarded.url + "/v1/models", headers=headers, timeout=TIMEOUT).status_code == 401
    assert httpx.get(guarded.url + "/health", timeout=TIMEOUT).status_code == 200   # open, as gRPC health is


def test_auth_with_the_token_works_with_the_openai_client(guarded):
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key="s3cret-alice", timeout=TIMEOUT, max_retries=0)
    whole = client.chat.completions.create(**chat_args("hi", 4))
    assert whole.usage.completion_tokens == 4
    bad = openai.OpenAI(base_url=guarded.url + "/v1", api_key="nope", timeout=TIMEOUT, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(**chat_args("hi", 4))
