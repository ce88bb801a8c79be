"""router/features/discovery/commands.py: `routerctl register`."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from router.ctl import main_routerctl


class TestRegister:
    """`routerctl register` errors a person can fix: one line, no traceback (the registration
    itself runs against a real ZooKeeper in test_discovery.py and test_routerd_zookeeper.py)."""

    BASE = ("register", "--zookeeper", "127.0.0.1:2181", "--path", "/fleet", "--node-id", "b1")

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--path", "fleet"], "register: path must be an absolute znode path below /, got 'fleet'"),
            (["--zookeeper", "localhost"], "register: connect string must be host:port"),
            (
                ["--connector", "amqp://h:1"],
                "register: connector must be a tcp://host:port URL, got 'amqp://h:1'",
            ),
            (["--connector", "tcp://h:1?probe=x"], "register: connector: probe must be one of"),
            (["--backup", "h:2"], "register: backup must be a tcp://host:port URL, got 'h:2'"),
            (["--weight", "0"], "register: weight must be an integer 1-1000000, got 0"),
            (["--node-id", ""], "register: node_id must be 1-255 characters, got ''"),
        ],
    )
    def test_register_usage_errors_exit_2_with_one_line(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
    ) -> None:
        args = [*self.BASE, "--connector", "tcp://127.0.0.1:1883", *argv]
        with pytest.raises(SystemExit) as exit_info:
            main_routerctl(args)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"routerctl: error: {message}")
        assert len(err.splitlines()) == 1

    @pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
    def test_register_rejects_a_connect_timeout_that_is_not_finite_and_positive(
        self, capsys: pytest.CaptureFixture[str], value: str
    ) -> None:
        with pytest.raises(SystemExit) as exit_info:
            main_routerctl([*self.BASE, "--connector", "tcp://127.0.0.1:1883", f"--connect-timeout={value}"])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "routerctl register: error: argument --connect-timeout: must be a finite number of seconds > 0, "
            f"got {value!r}"
        )

    @pytest.mark.parametrize("value", ["0", "2147483648", "1e3", "soon"])
    def test_register_rejects_a_session_timeout_zookeeper_cannot_take(
        self, capsys: pytest.CaptureFixture[str], value: str
    ) -> None:
        """Scenario: above 2^31-1 ms (ZooKeeper's int) kazoo's connection loop died with a traceback."""
        with pytest.raises(SystemExit) as exit_info:
            main_routerctl([*self.BASE, "--connector", "tcp://127.0.0.1:1883", f"--session-timeout={value}"])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "routerctl register: error: argument --session-timeout: must be an integer 1-2147483647, "
            f"got {value!r}"
        )

    def test_register_unreachable_zookeeper_exits_1_without_traceback(self) -> None:
        with socket.socket() as unused:  # a port nothing listens on
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from router.ctl import routerctl_main; routerctl_main()",
                "register",
                "--zookeeper",
                f"127.0.0.1:{port}",
                "--path",
                "/fleet",
                "--node-id",
                "b1",
                "--connector",
                "tcp://127.0.0.1:1883",
                "--connect-timeout",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1
        assert (
            proc.stderr.strip()
            == f"routerctl: error: register: cannot reach zookeeper 127.0.0.1:{port} within 0.5 s"
        )
