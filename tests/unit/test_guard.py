"""The Guard interceptor, on a loopback server with a servicer that only raises: identity, log ids,
session ownership and the status (with trailing metadata) of each domain error, unary and streaming."""
import asyncio

import grpc
import pytest

from edgespec.errors import Aborted, InvalidArgument, ResourceExhausted
from edgespec.net import rpc
from edgespec.net.security import Guard, SessionOwners, current_identity, token_digest
from edgespec.observe import logs
from edgespec.v1 import verifier_pb2 as pb
from edgespec.v1 import verifier_pb2_grpc

TOKENS = {token_digest("alice-token"): "alice", token_digest("bob-token"): "bob"}


class Raising(verifier_pb2_grpc.VerifierServicer):
    """Records what each call sees (log ids, identity) and raises what its request asks for."""

    def __init__(self, owners: SessionOwners):
        self.owners = owners
        self.seen: list[tuple] = []

    def _saw(self, what: str) -> None:
        self.seen.append((what, logs.session_id.get(), logs.request_id.get(), current_identity()))

    async def OpenSession(self, request, context):
        with self.owners.opening(request.session_id):
            self._saw("open")
            if not request.tokens:
                raise InvalidArgument("tokens", "must hold at least one token")
        return pb.OpenSessionResponse(committed_position=len(request.tokens))

    async def VerifyStream(self, request_iterator, context):
        async for window in request_iterator:
            self._saw("verify")
            if window.base_position == 99:
                raise Aborted("stale window", committed_position=7)
            if window.base_position == 98:
                raise ResourceExhausted("queue full", retry_after_seconds=0.25)
            yield pb.Verdict(session_id=window.session_id, window_seq=window.window_seq)

    async def CloseSession(self, request, context):
        self._saw("close")
        self.owners.release(request.session_id)
        return pb.CloseSessionResponse()


def run(scenario):
    owners = SessionOwners(8)
    servicer = Raising(owners)

    async def go():
        def register(server):
            verifier_pb2_grpc.add_VerifierServicer_to_server(servicer, server)
            return []
        server, port, _ = rpc.create_server("127.0.0.1", 0, register,
                                            interceptors=[Guard(TOKENS, False, None, owners=owners)])
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await scenario(verifier_pb2_grpc.VerifierStub(channel), owners)
        finally:
            await server.stop(0)
    return asyncio.run(go()), servicer


def as_(who: str, request_id: str = "") -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {who}-token")] + ([(logs.REQUEST_ID_KEY, request_id)] if request_id else [])


async def status_of(call) -> tuple[grpc.StatusCode, str, dict]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    error = raised.value
    return error.code(), error.details(), dict(error.trailing_metadata() or ())


def test_unary_calls_bind_log_ids_check_owners_and_map_errors():
    async def scenario(stub, owners):
        opened = await stub.OpenSession(pb.OpenSessionRequest(session_id="s1", tokens=[1, 2]),
                                        metadata=as_("alice", "req-1"))
        refused = await status_of(stub.OpenSession(pb.OpenSessionRequest(session_id="s1", tokens=[1]),
                                                   metadata=as_("bob")))
        closed_by_bob = await status_of(stub.CloseSession(pb.CloseSessionRequest(session_id="s1"),
                                                          metadata=as_("bob")))
        invalid = await status_of(stub.OpenSession(pb.OpenSessionRequest(session_id="s2"), metadata=as_("alice")))
        anonymous = await status_of(stub.OpenSession(pb.OpenSessionRequest(session_id="s3", tokens=[1])))
        return opened, refused, closed_by_bob, invalid, anonymous, owners.open_sessions("alice")

    (opened, refused, closed_by_bob, invalid, anonymous, held), servicer = run(scenario)
    assert opened.committed_position == 2
    assert refused[:2] == (grpc.StatusCode.PERMISSION_DENIED, "session 's1' belongs to another client")
    assert closed_by_bob[0] == grpc.StatusCode.PERMISSION_DENIED
    assert invalid[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "tokens: must hold at least one token")
    assert anonymous[0] == grpc.StatusCode.UNAUTHENTICATED
    assert held == 1                                    # s1; the failed open of s2 released its claim
    # Only alice's calls reached the servicer, each with its session and request ids bound.
    assert servicer.seen == [("open", "s1", "req-1", "alice"), ("open", "s2", "", "alice")]


def test_a_stream_binds_each_window_checks_its_owner_and_ends_with_the_errors_status():
    async def scenario(stub, owners):
        await stub.OpenSession(pb.OpenSessionRequest(session_id="s1", tokens=[1]), metadata=as_("alice"))
        results = []
        for who, windows in (("alice", [(1, 1), (2, 99)]), ("alice", [(1, 98)]), ("bob", [(1, 1)])):
            call = stub.VerifyStream(iter(pb.Window(session_id="s1", window_seq=seq, base_position=base)
                                          for seq, base in windows), metadata=as_(who, f"req-{who}"))
            verdicts = []
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async for verdict in call:
                    verdicts.append(verdict.window_seq)
            error = raised.value
            results.append((verdicts, error.code(), error.details(), dict(error.trailing_metadata() or ())))
        return results

    (aborted, exhausted, denied), servicer = run(scenario)
    assert aborted[:3] == ([1], grpc.StatusCode.ABORTED, "stale window (committed position 7)")
    assert aborted[3][rpc.COMMITTED_POSITION_KEY] == "7"
    assert exhausted[:3] == ([], grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    assert exhausted[3][rpc.RETRY_AFTER_KEY] == "250"
    assert denied[:2] == ([], grpc.StatusCode.PERMISSION_DENIED)
    assert [s for s in servicer.seen if s[0] == "verify"] == [("verify", "s1", "req-alice", "alice")] * 3


def test_a_subclass_of_a_domain_error_gets_its_base_class_status():
    """A backend's own error class (llama.cpp's ContextFull is a ResourceExhausted) ends a call with its base
    class's status, not UNKNOWN."""
    class ContextFull(ResourceExhausted):
        pass

    assert rpc.status_of(ContextFull("no free sequence")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rpc.status_of(InvalidArgument("x", "bad")) == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.status_of(ValueError("not a domain error")) == grpc.StatusCode.UNKNOWN
