"""An Artemis instance made from a template that `artemis create` wrote: the one way the test
suite's brokers (tests/conftest.py `Artemis`) and the benchmark's (benchmarks/artemis.py,
benchmarks/configs.py) copy the template and change its etc/broker.xml and etc/artemis.profile.

    copy_instance  copy the template to a new directory, write the files given, and point its
                   scripts and settings at the copy instead of the template
    broker_xml     a broker.xml with its name, its acceptor's port, more acceptors and what goes
                   after them (connectors, connection routers, an HA policy)
    profile_heap   an artemis.profile with its heap (and C1 alone)
    replace_once   the edit they are made of

Each edit expects what it replaces exactly once in the text and raises `ValueError` naming it
otherwise: an Artemis that writes its files differently fails here instead of starting a broker
that is not the one asked for. Text edits are pure; only `copy_instance` touches files.
"""

from __future__ import annotations

import re
import shutil
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

__all__ = ["CREATED_NAME", "CREATED_PORT", "broker_xml", "copy_instance", "profile_heap", "replace_once"]

CREATED_NAME: Final = "template"
"""The broker name the templates are created with (`artemis create --name`), replaced in each copy."""
CREATED_PORT: Final = 61616
"""The acceptor port the templates are created with (`artemis create --default-port`), replaced in
each copy."""


def replace_once(text: str, old: str, new: str, what: str) -> str:
    """`text` with `old`, found exactly once, replaced by `new`.

    Raises:
        ValueError: `old` is not in `text` once; the message starts with `what`.
    """
    found = text.count(old)
    if found != 1:
        raise ValueError(
            f"{what}: expected {old!r} once in what artemis create wrote, found it {found} times"
        )
    return text.replace(old, new)


def broker_xml(
    created: str,
    *,
    what: str,
    name: str | None = None,
    port: int | None = None,
    replace: Sequence[tuple[str, str]] = (),
    acceptors: str = "",
    after_acceptors: str = "",
) -> str:
    """An instance's etc/broker.xml changed.

    Args:
        created: the broker.xml to change (the template's, or the instance's own).
        what: names the instance in errors.
        name: the broker's `<name>` instead of `CREATED_NAME`; None: kept.
        port: its acceptor's port instead of `CREATED_PORT`; None: kept.
        replace: more changes, each `(old, new)` with `old` found once.
        acceptors: more `<acceptor>` elements, put last inside `<acceptors>`.
        after_acceptors: elements put right after `</acceptors>` (connectors, connection routers,
            cluster connections, an HA policy).

    Raises:
        ValueError: `created` lacks what is changed, or has it more than once.
    """
    xml = created
    if name is not None:
        xml = replace_once(xml, f"<name>{CREATED_NAME}</name>", f"<name>{name}</name>", what)
    if port is not None:
        xml = replace_once(xml, f"tcp://127.0.0.1:{CREATED_PORT}?", f"tcp://127.0.0.1:{port}?", what)
    for old, new in replace:
        xml = replace_once(xml, old, new, what)
    if acceptors or after_acceptors:
        xml = replace_once(xml, "</acceptors>", f"{acceptors}</acceptors>{after_acceptors}", what)
    return xml


def profile_heap(created: str, *, heap: str, c1_only: bool) -> str:
    """An instance's etc/artemis.profile with its heap set: -Xms64M -Xmx`heap` (`artemis create`
    writes -Xms512M whatever `--java-memory` says, and the JVM refuses an -Xms above -Xmx), and C1
    alone (`-XX:TieredStopAtLevel=1`, which starts a broker about 30 % sooner in 25 MB less) when
    `c1_only`.

    Raises:
        ValueError: `created` has no single -Xms/-Xmx pair, or `heap` is not like "512M".
    """
    if not re.fullmatch(r"[1-9][0-9]*[MG]", heap):
        raise ValueError(f"heap must be like '512M', got {heap!r}")
    pattern = re.compile(r"-Xms\S+ -Xmx\S+")
    if len(pattern.findall(created)) != 1:
        raise ValueError("artemis.profile: expected one '-Xms... -Xmx...' in what artemis create wrote")
    jit = "-XX:TieredStopAtLevel=1 " if c1_only else ""
    return pattern.sub(f"{jit}-Xms64M -Xmx{heap}", created)


def copy_instance(template: Path, base: Path, etc: Mapping[str, str]) -> None:
    """Copy the template instance to `base`, write the files of `etc` into its etc/ (by name: made
    from the template's, so with its paths), then point its scripts and settings at `base` instead
    of the template (Artemis locks its instance directory: a copy that ran as the template would
    not start)."""
    shutil.copytree(template, base, symlinks=True)
    for file_name, text in etc.items():
        (base / "etc" / file_name).write_text(text)
    for path in [base / "bin" / "artemis", base / "bin" / "artemis-service", *(base / "etc").iterdir()]:
        path.write_text(path.read_text().replace(str(template), str(base)))
