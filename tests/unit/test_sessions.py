"""The engines' session table (edgespec.engines.sessions) and the verifier's failed-forward handling."""
import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.engines.sessions import Session, SessionTable
from edgespec.engines.verifier import VerifierEngine
from edgespec.errors import NotFound, ResourceExhausted, Unavailable
from edgespec.verify.sampling import SamplingParams
from edgespec.verify.window import Window
from tests.tiny import tiny


def test_idle_sessions_lose_their_kv_then_are_forgotten():
    table: SessionTable[Session] = SessionTable("verifier")
    for session_id, last_used in (("fresh", 95.0), ("idle", 50.0), ("empty", 50.0), ("gone", 0.0)):
        table[session_id] = Session([1], session_id, SamplingParams(), last_used)
    released = []
    evicted = table.evict_idle(100.0, 10.0, 100.0, drop_kv=lambda s: s.kv != "empty", release=released.append)
    assert (evicted.kv_dropped, evicted.forgotten) == (["idle"], ["gone"])   # an empty cache is not counted
    assert [s.kv for s in released] == ["gone"] and sorted(table) == ["empty", "fresh", "idle"]
    assert table.evict_idle(1000.0, 0.0, 0.0, drop_kv=lambda s: True).forgotten == []   # 0: never
    with pytest.raises(NotFound, match="'gone' is not open on this verifier; open it with its committed prefix"):
        table.find("gone")


class FailingTarget:
    """The tiny target, whose next forward (a batch or a tree) raises ``error``."""

    def __init__(self, target):
        self.target, self.error = target, None

    def __getattr__(self, name):
        return getattr(self.target, name)

    def _forward(self, name, *args):
        error, self.error = self.error, None
        if error is not None:
            raise error
        return getattr(self.target, name)(*args)

    def logits_rows_batch(self, *args):
        return self._forward("logits_rows_batch", *args)

    def tree_rows(self, *args):
        return self._forward("tree_rows", *args)


@pytest.mark.parametrize("error, expected", [(RuntimeError("out of memory"), Unavailable),
                                             (ResourceExhausted("full"), ResourceExhausted)])
def test_a_failed_forward_fails_its_windows_resets_their_caches_and_commits_nothing(error, expected):
    target = FailingTarget(tiny("tiny:3"))
    engine, reference = VerifierEngine(target, [TINY_EOS]), VerifierEngine(tiny("tiny:3"), [TINY_EOS])
    for e in (engine, reference):
        e.open("a", list(b"def hello():"))
        e.open("b", list(b"Hi!"))
    windows = [("a", Window(0, 12, (1, 2))), ("b", Window(0, 3, (3,)))]
    target.error = error
    results = engine.verify_batch(windows)
    for result in results:
        assert isinstance(result, expected)
        if expected is Unavailable:
            assert str(result).endswith("target forward failed: RuntimeError: out of memory")
        else:
            assert result is error
    assert all(target.cached_length(engine._sessions[s].kv) == 0 for s in "ab")
    assert engine.committed("a") == reference.committed("a") and engine.committed("b") == reference.committed("b")
    engine.verify_batch(windows)    # retried: the caches are restored from the committed prefixes
    reference.verify_batch(windows)
    assert engine.committed("a") == reference.committed("a") and engine.committed("b") == reference.committed("b")
    target.error = error
    [tree] = engine.verify_batch([("a", Window(1, len(engine.committed("a")), (4, 5), parents=(-1, -1)))])
    assert isinstance(tree, expected) and target.cached_length(engine._sessions["a"].kv) == 0
