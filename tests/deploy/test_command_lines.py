"""Every routerd and routerctl command line in deploy/ (and the Dockerfile's) is accepted by the
real argument parsers of router/cli.py: an option renamed there fails here, not in production."""

from __future__ import annotations

import pytest

from tests.deploy.conftest import (
    DOCKERFILE,
    SYSTEMD_UNIT,
    compose_command_lines,
    container_command_lines,
    dockerfile,
    kubernetes_containers,
    parse,
    systemd_command_lines,
)


def _all_command_lines() -> list[tuple[str, list[str]]]:
    image = dockerfile()
    found = [(DOCKERFILE.name, [*image.entrypoint, *image.cmd])]
    found += [(SYSTEMD_UNIT.name, argv) for argv in systemd_command_lines(SYSTEMD_UNIT)]
    for container in kubernetes_containers():
        found += [
            (f"kubernetes {container['name']}", argv) for argv in container_command_lines(container, image)
        ]
    found += [("compose", argv) for argv in compose_command_lines(image)]
    return found


COMMAND_LINES = _all_command_lines()


def test_command_lines_are_found() -> None:
    """The collection below would pass vacuously if it found nothing: it finds each kind."""
    where = [where for where, _ in COMMAND_LINES]
    assert "Dockerfile" in where
    assert "connection-router.service" in where
    assert "kubernetes routerd" in where
    assert "compose" in where
    programs = {(where, argv[0]) for where, argv in COMMAND_LINES}
    assert ("kubernetes routerd", "routerctl") in programs  # the preStop hook


@pytest.mark.parametrize(
    ("where", "argv"), COMMAND_LINES, ids=[f"{where}: {' '.join(argv[:2])}" for where, argv in COMMAND_LINES]
)
def test_command_line_is_accepted_by_the_real_parser(where: str, argv: list[str]) -> None:
    parse(argv)


def test_parse_refuses_an_unknown_option() -> None:
    with pytest.raises(AssertionError, match="unrecognized arguments: --grace-perod"):
        parse(["routerd", "--config", "x.xml", "--grace-perod", "10"])
    with pytest.raises(AssertionError, match="invalid choice: 'nope'"):
        parse(["routerctl", "nope"])
