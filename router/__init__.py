"""connection-router: routes each broker client connection to one broker, Artemis-style.

Parts, by folder (the import direction runs down this list; nothing imports `router` except
`tests` and the entry points):

- `tls_sni/`  leaf: TLS ClientHello parsing for SNI. Imports nothing of ours.
- `keys/`     routing keys: key types, connection facts, key resolution with filter and NULL, the
              sans-IO protocol sniffers and PROXY protocol parser, the user store. May import `tls_sni`.
- `policies/` pure policies picking a target for a key (FIRST_ELEMENT, ROUND_ROBIN,
              CONSISTENT_HASH, LEAST_CONNECTIONS, CONSISTENT_HASH_MODULO).
- `pools/`    connectors, targets, discovery members, pool configuration, readiness and quorum state.
- `cache/`    the sticky key -> node id cache with expire-after-access.
- `router/`   everything else, and all trio I/O:
    `settings` (config dataclasses), `config` (broker.xml loader + XSD), `passwords` (pool
    passwords: Artemis `ENC(...)`, environment, file), `engine` (the pure SPEC A1
    workflow), `routing` (quorum wait around the engine), `health` (probe loop), `discovery`
    (pool members from ZooKeeper, `routerctl register`), `sniffing` (reading a client's opening
    bytes), `tls` (TLS termination), `auth` (the router's own authentication), `answers` (what
    the router says to a client itself), `net` (connecting to targets), `proxy` (one
    connection: key -> route -> connect -> relay), `fastpath` (an epoll thread doing the same for
    plain-TCP acceptors), `connections` (the proxied connections open now: closing them on TTL
    or when their target fails), `server` (listeners, nursery tree, shutdown), `admin` (HTTP
    lookup API and /metrics), `metrics`, `cli` (`routerd`, `routerctl`).

`policies`, `pools`, `cache` and `keys` never read a clock or touch the network: they take facts
and `now` and return decisions or new state.
"""
