"""Session quotas for services and end users, and what a refused session does to a generation — in process.

Refusals are injected into the endpoints (the environment); the thing under test —
SessionOwners, the Guard's reading of the end-user metadata, FailoverVerifier's
homing, the round loop's drafter fallback, the engines — is real.
"""
import asyncio
import time

import pytest

from edgespec import errors
from edgespec.backends.registry import TINY_EOS
from edgespec.engines.drafter import DrafterEngine
from edgespec.errors import ResourceExhausted
from edgespec.loop.failover import FailoverVerifier, open_retry_delay
from edgespec.loop.pool import VerifierPool
from edgespec.net.security import (ANONYMOUS, END_USER_KEY, Caller, Guard, ServerSecurity, SessionOwners,
                               end_user_metadata, parse_identities)
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.window import FixedWindow
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny

TARGET, DRAFT = "tiny:3", "tiny:3~1"
PROMPT = list(b"def fib(n):")


def test_a_service_has_its_own_budget_and_its_end_users_their_per_client_limit():
    owners = SessionOwners(max_per_client=2, max_per_service=5)
    coordinator = lambda user=None: Caller("coordinator", service=True, end_user=user)  # noqa: E731
    for i in range(2):
        owners.claim(f"a{i}", coordinator("alice"))
    with pytest.raises(ResourceExhausted, match="client 'alice' of 'coordinator'.*--max-sessions-per-client"):
        owners.claim("a2", coordinator("alice"))
    owners.claim("b0", coordinator("bob"))
    owners.claim("own0", coordinator())                 # the service for itself: only its budget
    owners.claim("own1", coordinator())
    with pytest.raises(ResourceExhausted, match="service 'coordinator'.*--max-sessions-per-service") as raised:
        owners.claim("c0", coordinator("carol"))         # 5 open: the service's budget is full
    assert raised.value.retry_after_seconds == SessionOwners.SERVICE_RETRY_SECONDS   # they end all the time
    # An end user talking to us directly is another client: alice's slots via the coordinator are not hers.
    owners.claim("direct", "alice")
    owners.claim("direct2", "alice")
    # Ownership stays with the authenticated identity, whatever end user it named.
    with pytest.raises(errors.PermissionDenied):
        owners.check("a0", "alice")
    owners.check("a0", "coordinator")
    owners.release("own0")
    owners.claim("c0", coordinator("carol"))
    assert owners.open_sessions("coordinator") == 5 and owners.open_sessions("alice") == 2
    for sid in ("a0", "a1", "b0", "own1", "c0"):
        owners.release(sid)
    owners.claim("a-again", coordinator("alice"))       # every count came back down
    assert owners.open_sessions("coordinator") == 1


class Metadata:
    """What the Guard reads from a servicer context."""

    def __init__(self, *pairs):
        self.pairs = pairs

    def invocation_metadata(self):
        return self.pairs


@pytest.mark.parametrize("identity,services,metadata,expected", [
    ("coordinator", {"coordinator"}, [(END_USER_KEY, "alice")], Caller("coordinator", True, "alice")),
    ("coordinator", {"coordinator"}, [], Caller("coordinator", True, None)),
    # Not a service: the header is ignored, the caller stays itself (its own per-client limit).
    ("mallory", {"coordinator"}, [(END_USER_KEY, "alice")], Caller("mallory")),
    (ANONYMOUS, {"coordinator"}, [(END_USER_KEY, "coordinator")], Caller(ANONYMOUS)),
    # The default: without authentication everyone is anonymous, and anonymous is infrastructure.
    (ANONYMOUS, {ANONYMOUS}, [(END_USER_KEY, "alice")], Caller(ANONYMOUS, True, "alice")),
], ids=["service-names-user", "service-for-itself", "client-header-ignored", "anonymous-not-listed",
        "anonymous-listed-by-default"])
def test_the_guard_reads_the_end_user_only_from_a_service(identity, services, metadata, expected):
    guard = Guard(None, False, None, frozenset(services))
    assert guard.caller(identity, Metadata(*metadata)) == expected


@pytest.mark.parametrize("values", [["x" * 257], ["a", "b"]], ids=["too-long", "twice"])
def test_a_malformed_end_user_is_invalid_argument(values):
    guard = Guard(None, False, None, frozenset({"coordinator"}))
    with pytest.raises(errors.InvalidArgument, match=END_USER_KEY):
        guard.caller("coordinator", Metadata(*[(END_USER_KEY, v) for v in values]))


def test_service_identity_flags_and_what_a_coordinator_forwards():
    assert ServerSecurity().service_identities == (ANONYMOUS,)
    assert ServerSecurity().max_sessions_per_service >= 1024
    with pytest.raises(ValueError):
        ServerSecurity(max_sessions_per_service=0)
    assert parse_identities(" coordinator, cert:gw ,,coordinator") == ("coordinator", "cert:gw")
    assert parse_identities("") == ()
    from edgespec.net import security
    assert end_user_metadata() == []                                   # outside a served call
    for caller, sent in ((Caller("edge"), [(END_USER_KEY, "edge")]),     # an end user: its name goes upstream
                         (Caller("gw", True, "alice"), [(END_USER_KEY, "alice")]),   # a gateway's end user
                         (Caller(ANONYMOUS, True), []),                   # infrastructure calling for itself
                         (Caller("ünï"), [(END_USER_KEY, "%C3%BCn%C3%AF")])):       # metadata is ASCII
        token = security._CALLER.set(caller)
        try:
            assert end_user_metadata() == sent
        finally:
            security._CALLER.reset(token)


def test_open_retry_delay_honours_the_hint_and_grows_without_one():
    assert open_retry_delay(1.5, 1, rng=lambda: 0.0) == 1.5            # never before the hint
    assert 1.5 <= open_retry_delay(1.5, 1) <= 1.5 * 1.25
    plain = [open_retry_delay(None, n, rng=lambda: 0.0) for n in range(1, 9)]
    assert plain[:4] == [0.1, 0.2, 0.4, 0.8] and max(plain) == 5.0     # doubles, capped
    assert len({open_retry_delay(None, 3) for _ in range(20)}) > 1      # jittered


class Refusing(InProcessVerifier):
    """A live verifier that refuses the first ``refusals`` opens (its session quota is full)."""

    def __init__(self, engine, address, refusals, hint):
        super().__init__(engine, address)
        self.refusals, self.hint, self.opens = refusals, hint, []

    async def open(self, session_id, tokens, params=None):
        self.opens.append(time.monotonic())
        if len(self.opens) <= self.refusals:
            raise ResourceExhausted("client 'anonymous' has 64 open sessions", self.hint)
        await super().open(session_id, tokens, params)


def run(verifier, drafter, max_new=24, window=3):
    log = SessionLog(PROMPT, max_new, frozenset({TINY_EOS}))

    async def go():
        await verifier.open("s", PROMPT, None)
        async for _ in speculate(log, "s", drafter, verifier, FixedWindow(window)):
            pass
    asyncio.run(go())
    return log


@pytest.mark.parametrize("hint", [0.2, None], ids=["with-hint", "without-hint"])
def test_a_verifier_refusing_the_open_is_asked_again_not_banned(hint):
    refusing = Refusing(VerifierEngine(tiny(TARGET), [TINY_EOS]), "a", refusals=3, hint=hint)
    other = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]), "b")
    pool = VerifierPool(["a", "b"], base_backoff_seconds=30)
    pool.pin("b")                      # "a" is the least loaded: the session goes there
    failover = FailoverVerifier(pool, {"a": refusing, "b": other}, recovery_deadline_seconds=20)
    log = run(failover, InProcessDrafter(DrafterEngine(tiny(DRAFT))))
    assert log.generated == target_only_greedy(TARGET, PROMPT, 24)
    assert failover.address_of("s") == "a"                       # the same verifier, once it had room
    assert pool.endpoints["a"].failures == 0 and pool.available() == ["a", "b"]   # never banned
    gaps = [b - a for a, b in zip(refusing.opens, refusing.opens[1:])]
    assert len(gaps) == 3
    if hint is not None:
        assert min(gaps) >= hint                                  # the hint is honoured
    else:
        assert gaps[0] < gaps[2]                                  # backs off


def test_a_verifier_refusing_past_the_deadline_is_resource_exhausted_not_unreachable():
    refusing = Refusing(VerifierEngine(tiny(TARGET), [TINY_EOS]), "a", refusals=10 ** 6, hint=0.1)
    pool = VerifierPool(["a"])
    failover = FailoverVerifier(pool, {"a": refusing}, recovery_deadline_seconds=0.6)
    started = time.monotonic()
    with pytest.raises(ResourceExhausted, match="kept refusing"):
        asyncio.run(failover.open("s", PROMPT, None))
    assert time.monotonic() - started < 2
    assert pool.endpoints["a"].failures == 0


class RefusingDrafter(InProcessDrafter):
    """A live drafter whose session quota is full until ``free`` is set."""

    def __init__(self, engine):
        super().__init__(engine)
        self.free, self.refused = False, 0

    async def open(self, session_id, tokens, params=None):
        if not self.free:
            self.refused += 1
            raise ResourceExhausted("service 'anonymous' has 4096 open sessions", 0.05)
        await super().open(session_id, tokens, params)


def test_a_drafter_refusing_the_session_gives_target_only_rounds_and_is_asked_again_later():
    drafter = RefusingDrafter(DrafterEngine(tiny(DRAFT)))
    verifier = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    log = run(verifier, drafter, max_new=40)
    assert log.generated == target_only_greedy(TARGET, PROMPT, 40)
    assert log.stats.drafted == 0 and log.stats.rounds == 40          # target-only, correct
    assert 1 <= drafter.refused <= 3                                  # backed off (>= 1 s), not asked every round
