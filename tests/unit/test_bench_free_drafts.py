"""`edgespec bench free-drafts`: bad flags are refused before any model loads."""
import pytest

from bench.bench_free_drafts import main


@pytest.mark.parametrize("argv", [["--profile-context", "1"], ["--profile-context", "5000"], ["--threads", "0"],
                                  ["--cost-curve", "2,3"], ["--store", "-1"]])
def test_bad_flags_exit_with_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err
