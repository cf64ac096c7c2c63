"""The `edgespec` front door: at most ten commands, every bench suite and trainer reachable by its name with its
own --help, the old command names running the new ones with a deprecation notice, unknown names refused."""
import subprocess
import sys

import pytest

from edge_client.commands import COMMANDS, DEPRECATED, ROLES, SUITES, TRAINERS, Group

CLI = [sys.executable, "-m", "edge_client.cli"]


def edgespec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_help_lists_at_most_ten_commands_once_each():
    shown = edgespec("--help")
    assert shown.returncode == 0, shown.stderr
    listed = [line.split()[0] for line in shown.stdout.split("commands (each takes --help):")[1].splitlines()
              if line.startswith("  ")]
    assert listed == list(COMMANDS) and len(listed) <= 10


@pytest.mark.parametrize("group, name", [("bench", s) for s in SUITES] + [("train", t) for t in TRAINERS])
def test_every_suite_and_trainer_answers_help_under_its_own_name(group, name):
    shown = edgespec(group, name, "--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"usage: edgespec {group} {name} "), shown.stdout[:200]


@pytest.mark.parametrize("role", ROLES)
def test_every_role_serves_from_its_service_module(role):
    shown = edgespec("serve", role, "--help")
    assert shown.returncode == 0 and f"services.{role}" in shown.stdout.splitlines()[0]


def test_a_group_lists_its_members_and_refuses_an_unknown_one():
    listed = edgespec("bench", "--help")
    assert listed.returncode == 0 and all(f"  {suite} " in listed.stdout for suite in SUITES)
    bare = edgespec("bench")
    assert bare.returncode == 2 and "speed" in bare.stderr
    wrong = edgespec("bench", "capacty")
    assert wrong.returncode == 2 and "no suite 'capacty'" in wrong.stderr and "Traceback" not in wrong.stderr
    wrong = edgespec("frob")
    assert wrong.returncode == 2 and "invalid choice: 'frob'" in wrong.stderr


@pytest.mark.parametrize("old", ["bench-capacity", "soak", "train-awc", "sim-capacity"])
def test_an_old_name_runs_the_new_command_and_says_so(old):
    group, name = DEPRECATED[old]
    shown = edgespec(old, "--help")
    assert shown.returncode == 0, shown.stderr
    assert f"edgespec {old} is deprecated" in shown.stderr and f"use edgespec {group} {name}" in shown.stderr
    assert shown.stdout.startswith(f"usage: edgespec {group} {name} ")


def test_the_old_bench_with_flags_is_the_speed_suite():
    shown = edgespec("bench", "--limit", "1", "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: edgespec bench speed ")
    assert "use edgespec bench speed" in shown.stderr


def test_every_old_name_maps_to_a_member_that_exists():
    for group, name in DEPRECATED.values():
        assert isinstance(COMMANDS[group], Group) and name in COMMANDS[group].tools
    assert not set(DEPRECATED) & set(COMMANDS)
