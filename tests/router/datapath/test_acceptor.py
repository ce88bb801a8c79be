"""router/datapath/acceptor.py: what an acceptor's connections share."""

from __future__ import annotations

from keys.detect import make_detector
from policies import PolicyConfig
from router.config.settings import AcceptorConfig, Config, RouterConfig
from router.datapath.acceptor import ConnectionLimits, ServedAcceptor
from router.metrics import Metrics
from router.runtime import RouterRuntime


def test_served_acceptor_defaults() -> None:
    router = RouterConfig(name="r", policy=PolicyConfig(name="FIRST_ELEMENT"))
    acceptor = AcceptorConfig(name="mqtt", host="127.0.0.1", port=1, router="r")
    runtime = RouterRuntime(
        Config(source="t.xml", routers=(router,), acceptors=(acceptor,)), router, Metrics()
    )
    served = ServedAcceptor(
        config=acceptor, runtime=runtime, detect=make_detector(()), detect_inner=make_detector(())
    )
    assert (served.name, served.tls, served.users, served.connection_ttl_ms) == ("mqtt", None, None, -1)
    assert served.limits == ConnectionLimits(route_timeout_s=10.0, connect_timeout_s=5.0)
