"""connection-router: routes each broker client connection to one broker, Artemis-style.

Packages of the project, by folder (the import direction runs down this list; nothing imports
`router` except `tests`, `benchmarks`, `deploy` and the entry points):

- `tls_sni/`  leaf: TLS ClientHello parsing for SNI. Imports nothing of ours.
- `keys/`     routing keys: key types, connection facts, key resolution with filter and NULL, the
              sans-IO protocol sniffers and PROXY protocol parser, the user store.
- `policies/` pure policies picking a target for a key (the five Artemis policies).
- `pools/`    connectors, targets, discovery members, pool configuration, readiness and quorum state.
- `cache/`    the sticky key -> node id cache with expire-after-access.
- `router/`   the router itself, in layers (below).

Layers of `router/`, lowest first; a layer imports only the layers above it in this list:

- `config/`     the `broker.xml` loader (`loader`), the dataclasses it builds (`settings`), pool
                passwords (`passwords`) and the shipped XSD (`schema/`).
- `core/`       pure decisions and bookkeeping, no trio, no socket, no clock (times are
                arguments): the SPEC A1 workflow (`engine`), what the router says itself
                (`answers`), its own authentication (`auth`), the opening buffer (`opening`), the
                connection-TTL rule (`ttl`) and the registry of live connections (`live`).
- `runtime`     one router at run time: engine and pool under one lock, the quorum wait, counts,
                and the log lines and metrics of what happens to connections; `metrics` holds
                the Prometheus families.
- `datapath/`   the two data paths that carry connections out: `trio_path` (one trio task per
                connection) and `fast_path` (an epoll thread), with their I/O helpers (`reading`,
                `net`, `tls`).
- `services/`   what runs beside the data paths: health probes (`health`, `probes`), ZooKeeper
                discovery (`discovery`), the admin API (`admin`), connection-TTL checks
                (`ttl_checks`). They may use the data paths' I/O helpers.
- `server`      the process: listeners, the nursery tree, shutdown; `cli` the entry points
                (`routerd`, `routerctl`).

`policies`, `pools`, `cache`, `keys` and `router/core` never read a clock or touch the network:
they take facts and `now` and return decisions or new state.
"""
