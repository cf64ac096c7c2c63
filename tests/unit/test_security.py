"""The pieces of server security, without a server: tokens, rate limits, session owners, flag checks."""
import pytest

from edgespec import errors
from edgespec.net.security import RateLimiter, ServerSecurity, SessionOwners, load_tokens, token_digest
from edgespec.net.transport import ClientSecurity, read_token


def test_tokens_file_maps_digests_to_identities(tmp_path):
    path = tmp_path / "tokens.txt"
    path.write_text("# comment\nalice s3cret  # trailing comment\n\nbob t0ken\n")
    table = load_tokens(str(path))
    assert table == {token_digest("s3cret"): "alice", token_digest("t0ken"): "bob"}
    assert "s3cret" not in str(table)          # only digests are kept


@pytest.mark.parametrize("text,problem", [("alice\n", "expected"), ("a x y\n", "expected"),
                                          ("a same\nb same\n", "already given"), ("# nothing\n", "no tokens")])
def test_bad_tokens_files_are_refused_with_the_line(tmp_path, text, problem):
    path = tmp_path / "tokens.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        load_tokens(str(path))


def test_rate_limiter_allows_the_burst_then_the_rate():
    now = [0.0]
    limiter = RateLimiter(rate=2, burst=3, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(3)] == [0, 0, 0]
    assert limiter.take("a") == pytest.approx(0.5)      # empty: one call per 0.5 s
    assert limiter.take("b") == 0                       # per key
    now[0] = 0.5
    assert limiter.take("a") == 0
    assert limiter.take("a") > 0
    now[0] = 100
    assert [limiter.take("a") for _ in range(3)] == [0, 0, 0]   # refills to the burst, not beyond
    assert limiter.take("a") > 0


def test_rate_limiter_forgets_idle_keys_beyond_its_bound():
    now = [0.0]
    limiter = RateLimiter(rate=1, burst=1, clock=lambda: now[0])
    limiter.MAX_KEYS = 10
    for i in range(10):
        limiter.take(f"k{i}")
    now[0] = 5
    limiter.take("new")
    assert len(limiter._buckets) == 1


def test_session_owners_bind_sessions_and_limit_them_per_client():
    owners = SessionOwners(max_per_client=2)
    assert owners.claim("s1", "alice") is True
    assert owners.claim("s1", "alice") is False         # re-open by the owner
    with pytest.raises(errors.PermissionDenied):
        owners.claim("s1", "bob")
    with pytest.raises(errors.PermissionDenied):
        owners.check("s1", "bob")
    owners.check("s1", "alice")
    owners.check("unknown", "bob")                      # unknown: the engine says NOT_FOUND
    owners.claim("s2", "alice")
    with pytest.raises(errors.ResourceExhausted):
        owners.claim("s3", "alice")
    owners.claim("s3", "bob")
    owners.release("s1")
    owners.claim("s3b", "alice")
    assert owners.open_sessions("alice") == 2 and owners.open_sessions("bob") == 1
    owners.release("never")                              # harmless


@pytest.mark.parametrize("kwargs", [dict(tls_cert="c.pem"), dict(tls_key="k.pem"), dict(tls_client_ca="ca.pem"),
                                    dict(max_sessions_per_client=0), dict(rate_limit=-1), dict(max_message_bytes=10)])
def test_inconsistent_server_security_is_refused(kwargs):
    with pytest.raises(ValueError):
        ServerSecurity(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(tls_cert="c.pem"), dict(tls_ca="ca", tls_key="k.pem"),
                                    dict(tls_cert="c", tls_key="k"), dict(token=""), dict(token="a b")])
def test_inconsistent_client_security_is_refused(kwargs):
    with pytest.raises(ValueError):
        ClientSecurity(**kwargs)


def test_token_file_first_line(tmp_path):
    (tmp_path / "t").write_text("  abc  \nignored\n")
    assert read_token(str(tmp_path / "t")) == "abc"
    (tmp_path / "e").write_text("\n")
    with pytest.raises(ValueError):
        read_token(str(tmp_path / "e"))
    assert read_token(None) is None
