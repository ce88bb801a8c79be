"""connection-router: routes each broker client connection to one broker, Artemis-style.

Packages of the project, by folder (the import direction runs down this list; nothing imports
`router` except `pipeline`, `tests`, `benchmarks`, `deploy` and the entry points; `router` imports
nothing of `pipeline`, whose routerctl commands arrive through an entry point group):

- `tls_sni/`  leaf: TLS ClientHello parsing for SNI. Imports nothing of ours.
- `keys/`     routing keys: key types, connection facts, key resolution with filter and NULL, the
              sans-IO protocol sniffers (the wire protocol enum), a broker's refusal read from its
              first answer (`refusal`), the PROXY protocol parser, the user store.
- `policies/` pure policies picking a target for a key (the five Artemis policies).
- `pools/`    connectors, targets (HA pairs), discovery members, pool configuration, readiness and
              quorum state, passive health (`outlier`: which targets are ejected).
- `cache/`    the sticky key -> node id cache with expire-after-access, pins, and the journal a
              persisted cache's file is written from.
- `event_format/` leaf: the routing event log's file format, for routerd's event log, its writer
              process, the pipeline and the fuzz targets: the records and their one field list
              (`schema`), JSON lines (`lines`), Parquet (`parquet`), what a file format is
              (`files`), the frames routerd sends its writer (`frames`) and the C extension that
              records and decodes them (`_native`). Imports nothing of ours.
- `router/`   the router itself, in layers (below).
- `pipeline/` the PySpark jobs over the router's event log (`analyze`, `simulate`, the synthetic
              event generator); it replays keys through the router's own engine. The `pipeline`
              extra (PySpark, pandas, pyarrow, matplotlib); `router` never imports it (routerctl
              finds its commands through the entry point group `connection_router.routerctl`).

`router/` has two axes. Its layers (below) keep decisions pure and I/O apart. Its features
(`features/`, STYLE R13) each bring, in one folder, their pure rules (`rules.py`, and the event
log's records, field table, ring and recorder: linted as pure as `core/`), their service in routerd,
their admin routes, their routerctl commands and their metric families, declared once through the
contract in `feature.py`; `features/__init__.py`'s `FEATURES` is the one list the hubs (`server`,
`cli`, the admin API, the metrics registry) loop over. Features never import each other; what two
need is the kernel's (tests/test_layout.py checks both rules). Features: `probes` (active health),
`ttl` (connection TTL), `admin_states` (drain/maint and the state file), `cache` (operators' view of
the sticky cache, the sweep), `cache_store` (the persisted cache), `moves` (evacuation, rebalance,
paced shutdown), `event_log` (the routing event log: its records, ring, recorders, writer process
and files), `discovery` (members from ZooKeeper), `shared_cache` (the cache shared through
ZooKeeper) and `workers` (routerd's worker processes and the zones they share). A feature may also
bring routerd command-line options (`Option`: `--state-file`, `--discard-unreadable-cache`) and
members of the process's status document.

Layers of `router/`, lowest first; a module imports only its own layer and the layers above it in
this list (tests/test_layout.py checks it, and that there are no import circles):

1. `logs`       log-line hygiene any layer may use: `shown` (a client-supplied value, escaped and
                capped, in a `key=value` line) and `LogLimiter` (rate-limits repeated WARNING lines;
                `routerd` installs it); `conn_lines`, the buffer routerd writes the per-connection
                INFO lines through (as nginx's `access_log buffer=`). Import nothing of `router`.
2. `config/`    the `broker.xml` loader (`loader`), the wording of value rules (`values`), the
                acceptor URL parameters (`acceptor_params`), the dataclasses it builds (`settings`),
                pool passwords (`passwords`) and the shipped XSD (`schema/`).
3. `core/`      pure decisions and bookkeeping: no trio, no socket (ruff bans them), no clock (times
                are arguments), no logging.
                  `engine`       the SPEC A1 routing workflow; says when to wait for the quorum
                  `plan`         opening -> routing facts; opening + decision -> Refuse | Redirect |
                                 Proxy | HandOver; which acceptors must read openings and which
                                 the fast path may serve
                  `answers`      the bytes the router says itself, per protocol (SPEC A6)
                  `auth`         the router's own authentication
                  `admin_access` who may call what on the admin API, and its limits (connections
                                 per address, the wait after wrong tokens, request sizes)
                  `opening`      the opening buffer (byte cap, server-first replies, replay), and
                                 the report of a failed opening
                  `ttl`          which connection TTL a connection gets
                  `live`         the registry of proxied connections on both paths (counts, closing),
                                 and which connections a pool change closes; a registered
                                 connection builds its Connected, ConnectFailed and Closed
                  `admission`    the descriptor budget and the acceptors' connection limits: whether
                                 a new connection is served
                  `events`       the one report of what happens to connections and pools (each
                                 event is built in one place; its docstring says where)
                  `status`       the snapshot the admin API shows, and what is kept of
                                 each target's probes and state changes (`TargetHistory`)
                  `address`      (host, port) of peers and members
                  `discovery_session`  ZooKeeper discovery's session as a state table
                  `zookeeper_link`  a ZooKeeper session's state as status shows it: kazoo's
                                 reports and heartbeats (a frozen server is suspended)
                  `records`      `quick_init`, a cheaper `__init__` for per-connection records,
                                 generated ahead of time into `_generated_inits` by
                                 `python -m tools.generate`
                  `framing`      where a client's frames end, to move it at a frame boundary
                  `reload`       what a configuration reload changes: old vs new configuration ->
                                 routers, targets and acceptors added, removed, changed
4. `ctl_output`, `ctl_client`, `ctl_render`: routerctl's kernel: tables, JSON output and exit
                codes; the admin API client (`Ctl`) every command that asks a routerd runs with;
                what people see of routers, targets, decisions and the process.
5. `metric_values`, `storm_metrics`, `metrics`, `reports`: metric values (`Family`,
                `Histogram`), the Prometheus families (the storm protection's in `storm_metrics`,
                `Metrics.storm`; a feature's own: `FeatureMetrics`), and the subscribers that turn
                events into log lines and metric updates (one more consumer is one more subscriber).
6. `runtime/`  one router at run time, the kernel every feature shares: `kernel`
                (`RouterRuntime`: accept, decide, connect failures, lookups, status, reload),
                `state` (what the router's one lock guards, entered through `held()`), `pool`
                (the pool's changes, passive health and waits, and what changes close), `connections`
                (the data paths' registry, closing), `reports` (its subscribers). A feature's own
                slice of a router at run time lives in its folder, written against `held()`.
7. `datapath/`  the two data paths, which carry out the plan with the same phases (accept, open,
                decide, plan, answer | connect, replay, relay, closed): `trio_path` (one task per
                connection) and `fast_path` (an epoll thread), whose loop `native_path` carries
                on a C core (`_core.c`, the default when built; `fast_path` is its fallback and
                reference), with `acceptor` (what an acceptor's connections share), `reading`,
                `relay`, `net` and `tls`.
8. `feature`    the contract of a feature folder: `Feature`, its `Service` hooks (open_files,
                prepare_router, discard_prepared, router_added, router_changed, router_removed,
                process_status, serve, serve_router, serve_router_data, targets_left, stopping,
                close_files), its routerd `Option`s, admin `Route`s and the `Call` they get,
                routerctl `Command`s and its part of a router's routerctl output; `processes`,
                which of routerd's processes this is (`--workers`) and the supervisor's orders to
                its workers (`Peers`), which the kernel hands every feature.
9. `services/`  beside the data paths: the ZooKeeper client and a session's state that
                discovery and the shared cache use (`zookeeper`), the admin API
                (`admin`, its HTTP server; `admin_routes`, the kernel's routes), a persisted
                cache's file and its writer process (`cache_store`: the cache store feature writes
                it, `routerctl route --cache` reads it), whether a filesystem takes writes
                (`files`), the process's status document (`process`). They may use the data
                paths' I/O helpers (`net`, `reading`).
10. `features/` one folder per feature (above): `probes/` (`checks`, one per broker protocol;
                `service`, each router's health-check loop; `counts` and `status`, the brokers'
                own connection counts read and shown), `ttl/` (`service`, the connection-TTL
                checker), `moves/` (`rules`, `service` with `Moves`, `routes`, `commands`:
                `routerctl evacuate`, `rebalance`, `shutdown`, `metrics`), `cache/` (`service`: the
                cache's slice of a router and the sweep of expired entries; `routes`,
                `commands`: `cache`), `event_log/` (pure: `sources`, the one table of where each
                field of a record comes from in an event, `records`, an event's values and record
                by code generated from it, `_generated_records`; `ring`, the bounded ring between
                routing and the writer; `recorder`, the C or the Python recorder; I/O: `service`,
                the log in routerd, `EventLog`, and `EventLogService`; `writer`, its writer
                process, with `files`; `routes`, `commands`: `event-log`, `metrics`),
                `discovery/` (`service`: each router's members read from ZooKeeper, and
                `routerctl register`'s registration; `commands`: `register`), `shared_cache/`
                (`znodes`, pure: a key's znode and entry; `service`: one router's side of the
                cache shared through ZooKeeper; `metrics`), `admin_states/` (`state_file`: the
                file and its retried writes; `service`; `routes`; `commands`: `state`),
                `cache_store/` (`service`: each router's file loaded before it serves, its
                changes written, the last ones at exit; `metrics`), `workers/` (`_zone.c` and
                `zone`: a router's shared cache, round-robin position and board; `rules`, pure:
                what several workers refuse, the board, the counts summed; `service`: the
                supervisor's workers and a worker's link to it).
11. `acceptors`, `kept_files`, `router_tasks`, `reload`: what the process and a reload share
                (serving acceptors, the features' files at start and exit, each router's service
                tasks), and the reload itself.
12. `server`    the process: the nursery tree, start and shutdown; starts each feature's service
                and hands it the kernel (`feature.Kernel`).
13. `cli`, `ctl`, `ctl_commands`: the entry points: `routerd` (`cli`, and `__main__`) and
                `routerctl` (`ctl`), whose commands are the kernel's (`ctl_commands`: route,
                target, status, wait, reload), `FEATURES`' and the entry point group
                `connection_router.routerctl`'s (the pipeline's): one `Command` contract for all.

Where a rule lives: what a decision becomes on the wire is `core/plan.py`; which broker a key goes
to is `core/engine.py` with `policies/`; when a target is ready is `pools/pool.py`, probed by
`features/probes/`; what is logged and counted for a connection is `reports.py`; how a client's
value is printed in a log line, and how often one line may repeat, is `logs.py`; configuration
defaults are the dataclasses' (`config/settings.py`, `pools/`, `cache/`, `policies/`); what a
configuration reload changes is `core/reload.py`, and how it is applied `reload.py`.
"""
