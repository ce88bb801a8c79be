"""Tests for router/features/admin_states/state_file.py: the targets' administrative states across
restarts."""

from __future__ import annotations

import json

import pytest
import trio

from pools import AdminState
from router.features.admin_states.state_file import (
    RETRY_MAX_S,
    KeptStates,
    StateFile,
    StateFileError,
    StateFileStatus,
    default_state_file,
    retry_delay_s,
)


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


def test_retry_delay_s_doubles_from_one_second_up_to_the_bound():
    assert [retry_delay_s(n) for n in (1, 2, 3, 4, 5, 6, 7, 1000)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
        30.0,
    ]
    assert RETRY_MAX_S == 30.0


async def test_kept_states_retry_a_failed_write_until_it_succeeds(tmp_path):
    """Scenario: the file's directory is missing when a drain is set; once it is there, the retry
    writes the drain, and the status says so (real files, real clock: the probe is a process)."""
    path = tmp_path / "later" / "s.json"
    states = {"r": {"b1": AdminState.DRAIN}}
    kept = KeptStates(StateFile(str(path)), lambda: states)
    assert kept.status().persisted
    async with trio.open_nursery() as nursery:
        await nursery.start(kept.serve)
        error = await kept.changed_and_written(5.0)
        assert error is not None
        assert error.startswith(f"state file {str(path)!r} cannot be written: ")
        status = kept.status()
        assert (status.persisted, status.error) == (False, error)
        (tmp_path / "later").mkdir()
        with trio.fail_after(5):  # the next try: 1 s after the first failure
            assert await kept.changed_and_written(5.0) is None
        nursery.cancel_scope.cancel()
    assert json.loads(path.read_text())["routers"] == {"r": {"b1": "drain"}}
    assert kept.status().error is None


async def test_kept_states_close_writes_what_the_file_lacks(tmp_path):
    path = tmp_path / "s.json"
    kept = KeptStates(StateFile(str(path)), lambda: {"r": {"b1": AdminState.MAINT}})
    assert await kept.changed_and_written(0) is not None  # nobody serves: not written
    await kept.close(5.0)
    assert json.loads(path.read_text())["routers"] == {"r": {"b1": "maint"}}
    assert kept.status().persisted


def test_server_status_document_says_whether_the_state_file_keeps_the_states() -> None:
    """Scenario: a drain the state file does not hold yet shows as not persisted, with the reason
    (the document's `state_file` member: `AdminStates.process_status`)."""
    kept = StateFileStatus(path="/var/lib/s.json", persisted=False, error="state file '/var/lib/s.json': x")
    assert kept.to_json() == {
        "path": "/var/lib/s.json",
        "persisted": False,
        "error": "state file '/var/lib/s.json': x",
    }
