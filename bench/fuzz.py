"""Fuzz the services' request handling over real gRPC: malformed, oversized and adversarial messages.

    edgespec bench fuzz --inputs 100000 [--json PATH] [--seed S]

Starts a verifier, a drafter and a coordinator (tiny random models) on loopback
and sends them inputs drawn by hypothesis from the protobuf descriptors
themselves, so every field of every request is covered, new fields included:
  - structured messages with adversarial values: ids outside the vocabulary,
    negative / huge positions and windows, NaN and infinite weights, empty,
    long and non-printable session ids, repeated fields from empty to far over
    every limit, and session ids of sessions that really are open;
  - the same messages serialized and then corrupted (bytes flipped, truncated),
    and random bytes: malformed protobuf;
  - streams of 1..3 such windows on one VerifyStream.

Every input must end in OK or a status that names the caller's mistake
(INVALID_ARGUMENT, NOT_FOUND, ABORTED, RESOURCE_EXHAUSTED, PERMISSION_DENIED),
or, for bytes that are not a protobuf message at all, gRPC's own INTERNAL
"deserializing" refusal, within a deadline. UNKNOWN (an unexpected exception in
a handler), a deadline (a hang) or UNAVAILABLE (a dead server) is a failure.
After the run, canary sessions opened before it must be untouched (the same
verdict and the same draft as a reference computed before), a generation must
equal the one made before, and every process must still be alive and SERVING.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import descriptor as d
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from harness.cluster import LocalCluster
from edgespec.v1 import coordinator_pb2, drafter_pb2, verifier_pb2

OPEN_IDS = ["fuzz-a", "fuzz-b"]         # sessions the fuzzer opens and drives itself
CANARY = "canary"                        # opened before fuzzing, never named by an input
INT_EDGES = [0, 1, -1, 2, 3, 7, 8, 9, 16, 17, 255, 256, 319, 320, 321, 511, 512, 513, 4096, 2**31 - 1, -2**31]
STRINGS = [*OPEN_IDS, "", " ", "x" * 128, "x" * 129, "\x00", "s\x07id", "é", "🙂" * 40, "../../etc/passwd"]
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ABORTED,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED}
DEADLINE_SECONDS = 20.0


def method_name(path: str) -> str:
    """'/edgespec.v1.Verifier/OpenSession' -> 'Verifier.OpenSession'."""
    return path.rsplit(".", 1)[-1].replace("/", ".")


def acceptable(code: grpc.StatusCode, details: str) -> bool:
    """OK, a status naming the caller's mistake, or grpc's own refusal of bytes that do not parse."""
    return code in ALLOWED or (code == grpc.StatusCode.INTERNAL and "deserializ" in details.lower())

# (service, method, request type, kind); kinds: unary, stream (response stream), bidi
TARGETS = [
    ("verifier", "/edgespec.v1.Verifier/OpenSession", verifier_pb2.OpenSessionRequest, "unary"),
    ("verifier", "/edgespec.v1.Verifier/VerifyStream", verifier_pb2.Window, "bidi"),
    ("verifier", "/edgespec.v1.Verifier/CloseSession", verifier_pb2.CloseSessionRequest, "unary"),
    ("verifier", "/edgespec.v1.Verifier/Info", verifier_pb2.InfoRequest, "unary"),
    ("drafter", "/edgespec.v1.Drafter/OpenSession", drafter_pb2.DrafterOpenRequest, "unary"),
    ("drafter", "/edgespec.v1.Drafter/Draft", drafter_pb2.DraftRequest, "unary"),
    ("drafter", "/edgespec.v1.Drafter/Crop", drafter_pb2.CropRequest, "unary"),
    ("drafter", "/edgespec.v1.Drafter/CloseSession", drafter_pb2.DrafterCloseRequest, "unary"),
    ("coordinator", "/edgespec.v1.Coordinator/Generate", coordinator_pb2.GenerateRequest, "stream"),
]


def _scalar(f: d.FieldDescriptor) -> st.SearchStrategy:
    t = f.type
    if t in (d.FieldDescriptor.TYPE_INT32, d.FieldDescriptor.TYPE_SINT32, d.FieldDescriptor.TYPE_SFIXED32,
             d.FieldDescriptor.TYPE_ENUM):
        return st.one_of(st.sampled_from(INT_EDGES), st.integers(-2**31, 2**31 - 1))
    if t in (d.FieldDescriptor.TYPE_INT64, d.FieldDescriptor.TYPE_SINT64, d.FieldDescriptor.TYPE_SFIXED64):
        return st.one_of(st.sampled_from(INT_EDGES + [2**63 - 1, -2**63]), st.integers(-2**63, 2**63 - 1))
    if t in (d.FieldDescriptor.TYPE_UINT32, d.FieldDescriptor.TYPE_FIXED32):
        return st.one_of(st.sampled_from([0, 1, 2, 16, 2**32 - 1]), st.integers(0, 2**32 - 1))
    if t in (d.FieldDescriptor.TYPE_UINT64, d.FieldDescriptor.TYPE_FIXED64):
        return st.one_of(st.sampled_from([0, 1, 2**64 - 1]), st.integers(0, 2**64 - 1))
    if t == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (d.FieldDescriptor.TYPE_FLOAT, d.FieldDescriptor.TYPE_DOUBLE):
        width = 32 if t == d.FieldDescriptor.TYPE_FLOAT else 64
        return st.one_of(st.sampled_from([0.0, -0.0, 0.5, 0.7, 1.0, 1.5, float("nan"), float("inf"), -1.0, 1e-45]),
                         st.floats(width=width))
    if t == d.FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(STRINGS), st.text(max_size=64),
                         st.integers(0, 70_000).map(lambda n: "a" * n))
    if t == d.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    raise TypeError(f"no strategy for field {f.full_name} of type {t}")


def message_strategy(descriptor: d.Descriptor, depth: int = 0) -> st.SearchStrategy:
    """Messages of this type, each field present or not, with adversarial values."""
    cls = GetMessageClass(descriptor)
    optional: dict[str, st.SearchStrategy] = {}
    for f in descriptor.fields:
        if f.type == d.FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            optional[f.name] = st.dictionaries(_scalar(key), _scalar(value), max_size=4)   # e.g. trace context
            continue
        if f.type == d.FieldDescriptor.TYPE_MESSAGE:
            if depth >= 2:
                continue
            element = message_strategy(f.message_type, depth + 1)
        elif f.name == "session_id":   # mostly sessions that exist, so inputs reach past the lookup
            element = st.one_of(st.sampled_from(OPEN_IDS), st.sampled_from(OPEN_IDS), _scalar(f))
        else:
            element = _scalar(f)
        if f.is_repeated:
            many = st.lists(element, max_size=24)
            if f.type != d.FieldDescriptor.TYPE_MESSAGE:
                many = st.one_of(many, st.tuples(element, st.sampled_from([100, 513, 5_000, 70_000])).map(
                    lambda pair: [pair[0]] * pair[1]))
            optional[f.name] = many
        else:
            optional[f.name] = element
    return st.fixed_dictionaries({}, optional=optional).map(lambda fields: cls(**fields))


def _corrupt(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for where, value in edits:
        if out:
            out[where % len(out)] = value
    return bytes(out[: cut % (len(out) + 1)] if cut is not None else out)


def payload_strategy(request_type) -> st.SearchStrategy:
    """Serialized requests: well-formed, corrupted, or random bytes."""
    messages = message_strategy(request_type.DESCRIPTOR).map(lambda m: m.SerializeToString())
    corrupted = st.tuples(messages, st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1,
                                             max_size=4), st.none() | st.integers(0, 1 << 20)).map(
        lambda t: _corrupt(*t))
    return st.one_of(messages, messages, corrupted, st.binary(max_size=256))


def case_strategy() -> st.SearchStrategy:
    """(target index, payloads): one payload, or 1..3 windows for a VerifyStream."""
    def for_target(index: int):
        _, _, request_type, kind = TARGETS[index]
        count = st.integers(1, 3) if kind == "bidi" else st.just(1)
        return count.flatmap(lambda n: st.lists(payload_strategy(request_type), min_size=n, max_size=n)).map(
            lambda payloads: (index, payloads))
    return st.integers(0, len(TARGETS) - 1).flatmap(for_target)


@dataclass
class FuzzReport:
    inputs: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_method: Counter = field(default_factory=Counter)
    failures: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    state_intact: bool = False
    alive: bool = False

    def as_dict(self) -> dict:
        return {"inputs": self.inputs, "seconds": round(self.seconds, 1),
                "inputs_per_second": round(self.inputs / self.seconds, 1) if self.seconds else 0,
                "by_status": dict(self.by_status.most_common()), "by_method": dict(self.by_method.most_common()),
                "failures": self.failures[:20], "failure_count": len(self.failures),
                "state_intact": self.state_intact, "alive": self.alive}


class Fuzzer:
    """Sends fuzz cases to a running cluster and judges each answer."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)   # grpc.aio looks the loop up outside coroutines too
        self.channels = {name: self.loop.run_until_complete(self._channel(service.address))
                         for name, service in (("verifier", cluster.verifier), ("drafter", cluster.drafter),
                                               ("coordinator", cluster.coordinator))}
        self.report = FuzzReport()

    @staticmethod
    async def _channel(address: str) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])

    def close(self) -> None:
        for channel in self.channels.values():
            self.loop.run_until_complete(channel.close())
        asyncio.set_event_loop(None)
        self.loop.close()

    async def _send(self, target: int, payloads: list[bytes]) -> tuple[grpc.StatusCode, str]:
        service, method, _, kind = TARGETS[target]
        channel = self.channels[service]
        if kind == "bidi":
            # As the coordinator does: one window, then its verdict, then the next.
            call = channel.stream_stream(method)(timeout=DEADLINE_SECONDS)
            try:
                for payload in payloads:
                    await call.write(payload)
                    await call.read()
                await call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                pass   # the status says why
            return await call.code(), await call.details() or ""
        try:
            if kind == "unary":
                await channel.unary_unary(method)(payloads[0], timeout=DEADLINE_SECONDS)
            else:
                async for _ in channel.unary_stream(method)(payloads[0], timeout=DEADLINE_SECONDS):
                    pass
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
        return grpc.StatusCode.OK, ""

    def send(self, case) -> tuple[grpc.StatusCode, str]:
        target, payloads = case
        code, details = self.loop.run_until_complete(self._send(target, payloads))
        self.report.inputs += 1
        self.report.by_status[code.name] += 1
        self.report.by_method[method_name(TARGETS[target][1])] += 1
        if not acceptable(code, details):
            self.report.failures.append({"method": TARGETS[target][1], "status": code.name, "details": details[:300],
                                         "payload_hex": [p[:200].hex() for p in payloads]})
        return code, details

    # --- the state and liveness checks around a run -------------------------------------------------

    def call(self, service: str, method: str, request, response_type):
        return self.loop.run_until_complete(self.channels[service].unary_unary(
            method, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString)(request, timeout=DEADLINE_SECONDS))

    def verify(self, session_id: str, base: int, draft: list[int]) -> verifier_pb2.Verdict:
        async def go():
            call = self.channels["verifier"].stream_stream(
                "/edgespec.v1.Verifier/VerifyStream", request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=verifier_pb2.Verdict.FromString)(timeout=DEADLINE_SECONDS)
            await call.write(verifier_pb2.Window(session_id=session_id, base_position=base, draft_tokens=draft))
            verdict = await call.read()
            await call.done_writing()
            return verdict
        return self.loop.run_until_complete(go())

    def generate(self, prompt: str) -> list[int]:
        async def go():
            tokens = []
            async for event in self.channels["coordinator"].unary_stream(
                    "/edgespec.v1.Coordinator/Generate", request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=coordinator_pb2.GenerateResponse.FromString)(
                    coordinator_pb2.GenerateRequest(prompt=prompt, max_new_tokens=16, window=3),
                    timeout=DEADLINE_SECONDS):
                if event.HasField("chunk"):
                    tokens += event.chunk.token_ids
            return tokens
        return self.loop.run_until_complete(go())

    def snapshot(self) -> dict:
        """Open the canaries and record what they must still answer after the run."""
        prefix = list(b"canary prefix")
        for side, method, request, reply in (
                ("verifier", "/edgespec.v1.Verifier/OpenSession", verifier_pb2.OpenSessionRequest, verifier_pb2.OpenSessionResponse),
                ("drafter", "/edgespec.v1.Drafter/OpenSession", drafter_pb2.DrafterOpenRequest, drafter_pb2.DrafterOpenResponse)):
            for sid in (CANARY, "reference"):
                self.call(side, method, request(session_id=sid, tokens=prefix), reply)
        steps = [self.verify("reference", len(prefix) + i, []).next_token for i in range(3)]
        draft = self.call("drafter", "/edgespec.v1.Drafter/Draft", drafter_pb2.DraftRequest(
            session_id="reference", base_position=len(prefix), k=3), drafter_pb2.DraftResponse)
        return {"prefix": prefix, "steps": steps, "draft": list(draft.tokens), "generation": self.generate("def f(x):")}

    def intact(self, snapshot: dict) -> bool:
        n = len(snapshot["prefix"])
        verdict = self.verify(CANARY, n, snapshot["steps"][:2])
        draft = self.call("drafter", "/edgespec.v1.Drafter/Draft", drafter_pb2.DraftRequest(
            session_id=CANARY, base_position=n, k=3), drafter_pb2.DraftResponse)
        return ((verdict.accepted, verdict.next_token, verdict.committed_position) == (2, snapshot["steps"][2], n + 3)
                and list(draft.tokens) == snapshot["draft"] and self.generate("def f(x):") == snapshot["generation"])

    def alive(self) -> bool:
        async def serving(channel):
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        return all(s.process.poll() is None for s in self.cluster.services) and all(
            self.loop.run_until_complete(serving(c)) for c in self.channels.values())


def fuzz_cluster(log_dir: Path) -> LocalCluster:
    """The cluster under fuzz: tiny models, tight limits so inputs reach them, short generations."""
    limits = ["--max-window", "8", "--max-session-tokens", "512", "--max-sessions-per-client", "100000"]
    return LocalCluster(log_dir, verifier_args=["--model", "tiny:7", *limits],
                        drafter_args=["--model", "tiny:7~1", *limits],
                        coordinator_args=["--tokenizer", "bytes", "--max-window", "8", "--max-new-tokens", "16",
                                          "--max-prompt-tokens", "256", "--deadline", "10"])


def run(fuzzer: Fuzzer, inputs: int, seed: int | None = None, shrink: bool = False) -> FuzzReport:
    """Fuzz ``inputs`` cases; raise AssertionError on the first unacceptable answer (after shrinking if asked)."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @settings(max_examples=inputs, deadline=None, database=None, phases=phases, derandomize=seed is None,
              suppress_health_check=list(HealthCheck))
    @given(case=case_strategy())
    def one(case):
        code, details = fuzzer.send(case)
        assert acceptable(code, details), f"{TARGETS[case[0]][1]}: {code.name}: {details}"

    if seed is not None:
        from hypothesis import seed as with_seed
        one = with_seed(seed)(one)
    started = time.perf_counter()
    try:
        one()
    finally:
        fuzzer.report.seconds += time.perf_counter() - started
    return fuzzer.report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec bench fuzz", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs to send (default %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: derandomized)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as logs, fuzz_cluster(Path(logs)) as cluster:
        fuzzer = Fuzzer(cluster)
        snapshot = fuzzer.snapshot()
        print(f"fuzzing verifier, drafter and coordinator with {args.inputs} inputs ...", file=sys.stderr)
        done, step = 0, 5_000
        failed = None
        while done < args.inputs and failed is None:
            batch = min(step, args.inputs - done)
            try:
                run(fuzzer, batch, seed=(args.seed or 0) * 1_000_003 + done)
            except Exception as error:   # noqa: BLE001 - hypothesis wraps failures (flaky, groups)
                failed = f"{type(error).__name__}: {str(error)[-1500:]}"
            done += batch
            r = fuzzer.report
            print(f"  {r.inputs} inputs, {r.inputs / r.seconds:.0f}/s, {len(r.failures)} failures", file=sys.stderr)
            for failure in r.failures:
                print(f"    {failure['method']}: {failure['status']}: {failure['details'][:200]} "
                      f"({sum(len(p) for p in failure['payload_hex']) // 2} bytes shown)", file=sys.stderr)
        report = fuzzer.report
        for check in ("state_intact", "alive"):
            try:
                setattr(report, check, fuzzer.intact(snapshot) if check == "state_intact" else fuzzer.alive())
            except grpc.aio.AioRpcError as error:
                print(f"{check} check failed: {error.code().name}: {error.details()}", file=sys.stderr)
        fuzzer.close()
    result = report.as_dict()
    if failed:
        result["first_failure"] = failed
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = not report.failures and report.state_intact and report.alive
    print(f"{'PASS' if ok else 'FAIL'}: {report.inputs} inputs, {len(report.failures)} unacceptable answers, "
          f"state {'intact' if report.state_intact else 'CHANGED'}, services {'alive' if report.alive else 'DOWN'}",
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
