"""Tests for router/services/state_file.py: the targets' administrative states across restarts."""

from __future__ import annotations

import json

import pytest

from pools import AdminState
from router.services.state_file import StateFile, StateFileError, default_state_file


def test_a_missing_file_holds_nothing(tmp_path):
    assert StateFile(str(tmp_path / "none.json")).load() == {}


def test_states_round_trip_and_ready_is_not_kept(tmp_path):
    path = tmp_path / "s.json"
    states = StateFile(str(path))
    states.save({"r1": {"b": AdminState.MAINT, "a": AdminState.DRAIN, "c": AdminState.READY}, "r2": {}})
    assert json.loads(path.read_text()) == {"version": 1, "routers": {"r1": {"a": "drain", "b": "maint"}}}
    assert states.load() == {"r1": {"a": AdminState.DRAIN, "b": AdminState.MAINT}}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary left behind


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{", "is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b'{"version": 2}', 'is not a state file of version 1 ({"version": 1, …})'),
        (b'{"version": 1, "routers": []}', '"routers" must be an object, got []'),
        (b'{"version": 1, "routers": {"r": ["a"]}}', "router 'r' must map node ids to states, got ['a']"),
        (
            b'{"version": 1, "routers": {"r": {"a": "off"}}}',
            "router 'r' node id 'a': state must be one of ready, drain, maint, got 'off'",
        ),
    ],
)
def test_a_file_that_is_not_a_state_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(StateFileError) as info:
        StateFile(str(path)).load()
    assert str(info.value).endswith(message)
    assert str(info.value).startswith(f"state file {str(path)!r}")


def test_a_write_that_fails_leaves_no_temporary_and_the_old_file(tmp_path):
    path = tmp_path / "s.json"
    StateFile(str(path)).save({"r": {"a": AdminState.DRAIN}})
    blocker = tmp_path / "dir.json"
    blocker.mkdir()  # os.replace onto a directory fails
    with pytest.raises(StateFileError, match="cannot be written: Is a directory"):
        StateFile(str(blocker)).save({"r": {"a": AdminState.MAINT}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "s.json"]


def test_the_default_file_is_beside_the_configuration():
    assert default_state_file("/etc/cr/broker.xml") == "/etc/cr/broker-state.json"
