"""The artemis group's processes: instances copied from a template, the Java client's result line,
the Java client compiled warning-free. (The group's smoke run, real brokers and all, is in
test_run.py.)"""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from benchmarks.artemis import (
    CLIENT_CLASSPATH,
    FIRST_SESSION_SOURCE,
    FirstSessionResult,
    make_instance,
    missing_artemis,
)
from benchmarks.clients import ClientError

if TYPE_CHECKING:
    from pathlib import Path


def _template(root: Path) -> Path:
    """The files of an `artemis create`d instance that `make_instance` rewrites."""
    template = root / "template"
    (template / "bin").mkdir(parents=True)
    (template / "etc").mkdir()
    for name in ("artemis", "artemis-service"):
        (template / "bin" / name).write_text(f"ARTEMIS_INSTANCE='{template}'\n")
    (template / "etc" / "artemis.profile").write_text(f"ARTEMIS_INSTANCE='{template}'\n")
    (template / "etc" / "broker.xml").write_text("<created/>")
    (template / "etc" / "log4j2.properties").write_text("rootLogger.level = INFO\n")
    (template / "etc" / "bootstrap.xml").write_text(f"<broker xml='{template}/etc/broker.xml'/>")
    return template


def test_make_instance_points_the_copy_at_itself(tmp_path: Path) -> None:
    """Scenario: the profile passed in was made from the template's, with the template's paths in
    it; the copy must not run as the template (Artemis locks its instance directory)."""
    template = _template(tmp_path)
    base = tmp_path / "router"
    profile = (template / "etc" / "artemis.profile").read_text() + "JAVA_ARGS=-Xmx512M\n"
    make_instance(template, base, broker_xml="<router/>", profile=profile, log4j2="rootLogger.level = WARN\n")
    assert (base / "etc" / "broker.xml").read_text() == "<router/>"
    assert (
        base / "etc" / "artemis.profile"
    ).read_text() == f"ARTEMIS_INSTANCE='{base}'\nJAVA_ARGS=-Xmx512M\n"
    assert (base / "etc" / "log4j2.properties").read_text() == "rootLogger.level = WARN\n"
    assert (base / "bin" / "artemis").read_text() == f"ARTEMIS_INSTANCE='{base}'\n"
    assert str(template) not in (base / "etc" / "bootstrap.xml").read_text()
    assert (template / "etc" / "broker.xml").read_text() == "<created/>"


def test_make_instance_keeps_the_created_log4j2_unless_given(tmp_path: Path) -> None:
    template = _template(tmp_path)
    make_instance(template, tmp_path / "t1", broker_xml="<t/>", profile="p")
    assert (tmp_path / "t1" / "etc" / "log4j2.properties").read_text() == "rootLogger.level = INFO\n"


def test_first_session_result_from_json() -> None:
    line = (
        '{"rounds":2,"warmup":1,"ms":{"direct":[10.5,11.0],"artemis":[20.0],"routerd":[]},'
        '"errors":{"direct":0,"artemis":1,"routerd":2},'
        '"last_error":{"direct":"","artemis":"javax.jms.JMSException: AMQ219010","routerd":"x"}}'
    )
    result = FirstSessionResult.from_json(line)
    assert result.ms == {"direct": [10.5, 11.0], "artemis": [20.0], "routerd": []}
    assert result.errors == {"direct": 0, "artemis": 1, "routerd": 2}
    assert result.last_error["artemis"] == "javax.jms.JMSException: AMQ219010"


@pytest.mark.parametrize(
    "line", ["", "not json", '{"ms":{}}', '{"ms":{"a":["x"]},"errors":{},"last_error":{}}']
)
def test_first_session_result_rejects_other_lines(line: str) -> None:
    with pytest.raises(ClientError, match="unreadable result"):
        FirstSessionResult.from_json(line)


def test_missing_artemis_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "javac" else f"/usr/bin/{name}")
    assert "javac" in missing_artemis()
    assert "java" not in missing_artemis()


@pytest.mark.integration
def test_first_session_compiles_without_warnings(tmp_path: Path) -> None:
    javac = shutil.which("javac")
    if javac is None or not CLIENT_CLASSPATH[0].exists():
        pytest.fail("the artemis group needs a JDK and .cache/artemis: run deploy/bootstrap.sh")
    result = subprocess.run(
        [
            javac,
            "-Xlint:all",
            "-Werror",
            "-cp",
            str(CLIENT_CLASSPATH[0]),
            "-d",
            str(tmp_path),
            str(FIRST_SESSION_SOURCE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "FirstSession.class").is_file()
