"""tools/artemis_instance.py: an Artemis instance copied from a template, its broker.xml and
artemis.profile changed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tools/ is not an installed package (as benchmarks/ and fuzz/)
    sys.path.insert(0, str(ROOT))

from tools.artemis_instance import broker_xml, copy_instance, profile_heap, replace_once  # noqa: E402

CREATED_BROKER_XML = """<configuration xmlns="urn:activemq">
   <core xmlns="urn:activemq:core">
      <name>template</name>
      <persistence-enabled>true</persistence-enabled>
      <acceptors>
         <acceptor name="artemis">tcp://127.0.0.1:61616?protocols=CORE,AMQP,STOMP,HORNETQ,MQTT,OPENWIRE</acceptor>
      </acceptors>
   </core>
</configuration>
"""
"""The lines of Artemis 2.40's `artemis create --name=template --default-port=61616` broker.xml
that the edits change."""
CREATED_PROFILE = 'JAVA_ARGS="-XX:+UseG1GC -Xms512M -Xmx256M -Dhawtio.disableProxy=true"\n'


def test_replace_once_names_what_it_expected() -> None:
    assert replace_once("a b", "b", "c", "x") == "a c"
    with pytest.raises(
        ValueError, match=r"^x: expected 'b' once in what artemis create wrote, found it 2 times$"
    ):
        replace_once("b b", "b", "c", "x")
    with pytest.raises(ValueError, match="found it 0 times"):
        replace_once("a", "b", "c", "x")


def test_broker_xml_gives_the_copy_its_name_port_acceptors_and_what_follows_them() -> None:
    xml = broker_xml(
        CREATED_BROKER_XML,
        what="router",
        name="router",
        port=22000,
        replace=[("<persistence-enabled>true", "<persistence-enabled>false")],
        acceptors='<acceptor name="more">tcp://127.0.0.1:22001</acceptor>\n      ',
        after_acceptors="\n      <connectors/>",
    )
    assert "<name>router</name>" in xml
    assert "tcp://127.0.0.1:22000?protocols=CORE" in xml
    assert "<persistence-enabled>false</persistence-enabled>" in xml
    more = '<acceptor name="more">tcp://127.0.0.1:22001</acceptor>'
    assert f"{more}\n      </acceptors>\n      <connectors/>\n   </core>" in xml


def test_broker_xml_changes_only_what_it_is_given() -> None:
    assert broker_xml(CREATED_BROKER_XML, what="t") == CREATED_BROKER_XML
    renamed = broker_xml(CREATED_BROKER_XML, what="t", name="t")
    assert renamed == CREATED_BROKER_XML.replace("<name>template</name>", "<name>t</name>")


def test_broker_xml_rejects_a_file_without_what_it_changes() -> None:
    with pytest.raises(ValueError, match=r"^t1: expected '<name>template</name>' once"):
        broker_xml("<configuration/>", what="t1", name="t1")
    with pytest.raises(ValueError, match=re.escape("tcp://127.0.0.1:61616?")):
        broker_xml(CREATED_BROKER_XML.replace("61616", "61617"), what="t1", port=22000)
    with pytest.raises(ValueError, match="</acceptors>"):
        broker_xml("<configuration/>", what="t1", after_acceptors="<connectors/>")


@pytest.mark.parametrize(
    ("c1_only", "expected"),
    [(True, "-XX:TieredStopAtLevel=1 -Xms64M -Xmx256M"), (False, "-XX:+UseG1GC -Xms64M -Xmx256M -D")],
)
def test_profile_heap_sets_the_heap(c1_only: bool, expected: str) -> None:
    assert expected in profile_heap(CREATED_PROFILE, heap="256M", c1_only=c1_only)


def test_profile_heap_rejects_a_bad_heap_or_profile() -> None:
    with pytest.raises(ValueError, match="heap"):
        profile_heap(CREATED_PROFILE, heap="lots", c1_only=False)
    with pytest.raises(ValueError, match=re.escape("expected one '-Xms... -Xmx...'")):
        profile_heap("JAVA_ARGS=''\n", heap="256M", c1_only=False)


def test_copy_instance_writes_the_files_given_and_points_the_copy_at_itself(tmp_path: Path) -> None:
    """Scenario: the broker.xml given was made from the template's, with the template's paths in
    it; the copy must not run as the template (Artemis locks its instance directory)."""
    template = tmp_path / "template"
    (template / "bin").mkdir(parents=True)
    (template / "etc").mkdir()
    for name in ("artemis", "artemis-service"):
        (template / "bin" / name).write_text(f"ARTEMIS_INSTANCE='{template}'\n")
    (template / "etc" / "broker.xml").write_text(f"<created dir='{template}'/>")
    (template / "etc" / "bootstrap.xml").write_text(f"<broker xml='{template}/etc/broker.xml'/>")
    base = tmp_path / "b1"
    copy_instance(template, base, {"broker.xml": f"<b1 dir='{template}'/>"})
    assert (base / "etc" / "broker.xml").read_text() == f"<b1 dir='{base}'/>"
    assert (base / "etc" / "bootstrap.xml").read_text() == f"<broker xml='{base}/etc/broker.xml'/>"
    assert (base / "bin" / "artemis-service").read_text() == f"ARTEMIS_INSTANCE='{base}'\n"
    assert (template / "etc" / "broker.xml").read_text() == f"<created dir='{template}'/>"
