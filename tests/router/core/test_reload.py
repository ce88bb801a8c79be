"""Tests for router/core/reload.py: what a reload changes, from two configurations (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.config import load_config_text
from router.core.address import Address
from router.core.reload import NOTHING_CHANGED, ConfigDiff, Departed, RouterChange, diff_configs

if TYPE_CHECKING:
    from router.config.settings import Config

CONNECTORS = {
    "c0": "tcp://127.0.0.1:21001?nodeId=b0",
    "c1": "tcp://127.0.0.1:21002?nodeId=b1",
    "c2": "tcp://127.0.0.1:21003?nodeId=b2",
}


def config(
    *,
    connectors: dict[str, str] | None = None,
    refs: tuple[str, ...] = ("c0", "c1"),
    acceptors: dict[str, str] | None = None,
    router: str = "",
    extra_routers: str = "",
    groups: str = "",
    core: str = "",
    key_type: str = "CLIENT_ID",
) -> Config:
    """A configuration with router `r` (CLIENT_ID, ROUND_ROBIN over `refs`) and acceptor `a`."""
    connectors = CONNECTORS if connectors is None else connectors
    acceptors = {"a": "tcp://127.0.0.1:20001?router=r"} if acceptors is None else acceptors
    pool = "".join(f"<connector-ref>{r}</connector-ref>" for r in refs)
    pool = f"<static-connectors>{pool}</static-connectors>"
    return load_config_text(
        f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{"".join(f'<connector name="{n}">{u}</connector>' for n, u in connectors.items())}</connectors>
  <acceptors>{"".join(f'<acceptor name="{n}">{u}</acceptor>' for n, u in acceptors.items())}</acceptors>
  {groups}
  {core}
  <connection-routers>
    <connection-router name="r">
      <key-type>{key_type}</key-type>
      {router}
      <policy name="ROUND_ROBIN"/>
      <pool><check-period>200</check-period>{pool}</pool>
    </connection-router>
    {extra_routers}
  </connection-routers>
</core></configuration>""",
        source="router.xml",
    )


def test_diff_configs_of_the_same_file_changes_nothing() -> None:
    diff = diff_configs(config(), config())
    assert not diff.changed
    assert diff.summary() == NOTHING_CHANGED
    assert diff.to_json() == {
        "changed": False,
        "summary": NOTHING_CHANGED,
        "routers": {"added": [], "removed": [], "changed": []},
        "acceptors": {"added": [], "removed": [], "changed": []},
        "not_in_place": [],
    }
    assert diff.config == config()


class TestTargets:
    def test_diff_configs_target_added(self) -> None:
        diff = diff_configs(config(), config(refs=("c0", "c1", "c2")))
        assert diff.routers_changed == (
            RouterChange(name="r", what=("pool", "targets"), targets_added=("b2",)),
        )
        assert diff.routers_changed[0].departed == ()
        assert diff.acceptors_changed == ()
        assert diff.summary() == "router r changed (pool, targets; targets added: b2)"

    def test_diff_configs_target_removed_departs_its_connections(self) -> None:
        diff = diff_configs(config(refs=("c0", "c1", "c2")), config(refs=("c0", "c2")))
        (change,) = diff.routers_changed
        assert change.targets_removed == ("b1",)
        assert change.departed == (Departed(node_id="b1"),)

    def test_diff_configs_changed_connector_departs_only_the_addresses_that_went(self) -> None:
        moved = {**CONNECTORS, "c1": "(tcp://127.0.0.1:21002,tcp://127.0.0.1:21009)?nodeId=b1"}
        diff = diff_configs(config(), config(connectors=moved))
        (change,) = diff.routers_changed
        assert change.what == ("targets",)
        assert change.targets_changed == ("b1",)
        assert change.departed == ()  # the primary stays: nobody was connected to a gone address
        back = diff_configs(config(connectors=moved), config())
        assert back.routers_changed[0].departed == (
            Departed(node_id="b1", addresses=(Address("127.0.0.1", 21009),)),
        )

    def test_diff_configs_connector_parameters_change_the_target_but_depart_nothing(self) -> None:
        probed = {**CONNECTORS, "c0": "tcp://127.0.0.1:21001?nodeId=b0;probe=mqtt"}
        diff = diff_configs(config(), config(connectors=probed))
        assert diff.routers_changed[0].targets_changed == ("b0",)
        assert diff.routers_changed[0].departed == ()

    def test_diff_configs_unused_connector_changes_nothing(self) -> None:
        diff = diff_configs(config(), config(connectors={**CONNECTORS, "c2": "tcp://127.0.0.1:29999"}))
        assert not diff.changed


class TestRouters:
    def test_diff_configs_filter_and_policy_change(self) -> None:
        new = config(router="<key-filter>^[a-z]+</key-filter><cache><timeout>1000</timeout></cache>")
        (change,) = diff_configs(config(), new).routers_changed
        assert change.what == ("key-filter", "cache")
        assert change.departed == ()

    def test_diff_configs_router_added_and_removed(self) -> None:
        two = config(
            extra_routers='<connection-router name="s"><pool><static-connectors>'
            "<connector-ref>c2</connector-ref></static-connectors></pool></connection-router>",
            acceptors={"a": "tcp://127.0.0.1:20001?router=r", "b": "tcp://127.0.0.1:20002?router=s"},
        )
        added = diff_configs(config(), two)
        assert added.routers_added == ("s",)
        assert added.acceptors_added == ("b",)
        removed = diff_configs(two, config())
        assert removed.routers_removed == ("s",)
        assert removed.acceptors_removed == ("b",)
        assert removed.summary() == "routers removed: s; acceptors removed: b"

    def test_diff_configs_connection_ttl_changes_the_router_and_its_acceptor(self) -> None:
        diff = diff_configs(
            config(), config(acceptors={"a": "tcp://127.0.0.1:20001?router=r;connectionTtl=5000"})
        )
        assert diff.acceptors_changed == ("a",)
        assert diff.routers_changed[0].what == ("connection-ttl",)


class TestAcceptors:
    def test_diff_configs_acceptor_added_removed_changed(self) -> None:
        old = config(acceptors={"a": "tcp://127.0.0.1:20001?router=r", "b": "tcp://127.0.0.1:20002?router=r"})
        new = config(
            acceptors={
                "a": "tcp://127.0.0.1:20001?router=r;mode=redirect",
                "c": "tcp://127.0.0.1:20003?router=r",
            }
        )
        diff = diff_configs(old, new)
        assert (diff.acceptors_added, diff.acceptors_removed, diff.acceptors_changed) == (
            ("c",),
            ("b",),
            ("a",),
        )
        assert diff.routers_changed == ()

    def test_diff_configs_key_type_of_its_router_changes_an_acceptor(self) -> None:
        """Scenario: the key type decides the data path and whether the opening is read."""
        diff = diff_configs(config(), config(key_type="SOURCE_IP"))
        assert diff.acceptors_changed == ("a",)
        assert diff.routers_changed[0].what == ("key-type",)


class TestNotInPlace:
    def test_diff_configs_keeps_the_event_log_and_says_so(self) -> None:
        new = config(core="<event-log><directory>/tmp/elsewhere</directory></event-log>")
        diff = diff_configs(config(), new)
        assert not diff.changed
        assert diff.config.event_log is None
        assert diff.not_in_place == (
            "the <event-log> settings (or --event-log) changed: the event log goes on as it was.",
        )
        assert "restart routerd to apply" in diff.summary()

    def test_diff_configs_keeps_a_persisted_cache_and_applies_the_rest(self) -> None:
        old = config(router="<cache><persisted>true</persisted><timeout>1000</timeout></cache>")
        new = config(
            router="<cache><persisted>true</persisted><timeout>9000</timeout></cache>",
            refs=("c0", "c1", "c2"),
        )
        diff = diff_configs(old, new)
        (change,) = diff.routers_changed
        assert change.what == ("pool", "targets")
        assert diff.config.router("r").cache == old.router("r").cache
        assert len(diff.not_in_place) == 1
        assert "persisted or shared <cache>" in diff.not_in_place[0]
        again = diff_configs(diff.config, new)  # still not applied: said again
        assert again.not_in_place == diff.not_in_place
        assert not again.changed

    def test_diff_configs_holds_a_router_whose_discovery_changed(self) -> None:
        groups = (
            '<discovery-groups><discovery-group name="dg"><zookeeper connect="127.0.0.1:2181" path="/{}"/>'
            "</discovery-group></discovery-groups>"
        )
        discovered = "<policy name='FIRST_ELEMENT'/>"
        old = _discovery_config(groups.format("one"), discovered)
        new = _discovery_config(groups.format("two"), discovered)
        diff = diff_configs(old, new)
        assert diff.routers_changed == ()
        assert set(diff.held) == {"r"}
        assert diff.held["r"] is old
        assert "discovery group" in diff.not_in_place[0]
        # Still held on the next reload of the same file; released when the file is as it runs.
        assert set(diff_configs(diff.config, new, held=diff.held).held) == {"r"}
        assert diff_configs(diff.config, old, held=diff.held) == ConfigDiff(config=old, held={})


def _discovery_config(groups: str, policy: str) -> Config:
    return load_config_text(
        f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <acceptors><acceptor name="a">tcp://127.0.0.1:20001?router=r</acceptor></acceptors>
  {groups}
  <connection-routers><connection-router name="r">{policy}
    <pool><discovery-group-ref discovery-group-name="dg"/></pool>
  </connection-router></connection-routers>
</core></configuration>""",
        source="router.xml",
    )
