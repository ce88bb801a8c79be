# connection-router: runs `routerd` as a non-root user with the configuration mounted read-only and
# its state (targets' drain/maint states, kept across restarts) in the volume /var/lib/connection-router.
#   docker build -t connection-router .
#   docker run -v $PWD/broker.xml:/etc/connection-router/broker.xml:ro -v connection-router-state:/var/lib/connection-router \
#     -p 61616:61616 connection-router
# Without `-v …:/var/lib/connection-router` Docker gives the VOLUME an anonymous volume: the states
# then last as long as the container. A persisted cache or the event log go there too (their
# defaults, beside the read-only configuration, cannot be written): `<file>/var/lib/connection-router/
# cache-ROUTER.sqlite</file>` in `<cache>`, `--event-log /var/lib/connection-router/events`.
# The admin API (lookup, drain, cache, /metrics) listens on the container's loopback only. To reach
# it from outside, give it tokens (lines NAME LEVEL TOKEN, docs/operations.md) and bind it wider:
#   docker run … -v $PWD/admin-tokens:/etc/connection-router/admin-tokens:ro -p 9180:9180 connection-router \
#     --config /etc/connection-router/broker.xml --admin 0.0.0.0:9180 \
#     --admin-tokens /etc/connection-router/admin-tokens --state-file /var/lib/connection-router/state.json
# (routerd refuses a non-loopback --admin without --admin-tokens.) Options given to `docker run`
# replace the whole CMD: repeat --config and --state-file.
# The HEALTHCHECK asks /healthz on 127.0.0.1:9180: keep the admin API on port 9180 (0.0.0.0:9180
# answers on loopback too), or give `docker run --health-cmd …` (or `--no-healthcheck`).
# tests/deploy/test_image.py checks this file and .dockerignore, builds the wheel the image
# installs and runs the image's checks against it (there is no Docker on the development machine).

# The base, pinned by its full version: a rebuild gets the same Python. To move to a newer patch
# release, change the tag in both FROM lines (the build's Python and the image's must be the same
# for the venv copied between them) to another python:3.11.N-slim-bookworm of Docker Hub; pin a
# digest as well (`python:3.11.N-slim-bookworm@sha256:…`, from `docker buildx imagetools inspect`)
# for byte-for-byte rebuilds.
FROM python:3.11.16-slim-bookworm AS build

# gcc for the C extensions (setup.py: the event log's native recorder, the C CONNECT parsers), in this stage only.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY router ./router
COPY keys ./keys
COPY pools ./pools
COPY policies ./policies
COPY cache ./cache
COPY tls_sni ./tls_sni
COPY event_format ./event_format
COPY pipeline ./pipeline
RUN python -m venv /opt/connection-router \
    && /opt/connection-router/bin/pip install --no-cache-dir .

FROM python:3.11.16-slim-bookworm

RUN groupadd --system --gid 10001 router \
    && useradd --system --uid 10001 --gid router --no-create-home --shell /usr/sbin/nologin router \
    && install -d -o router -g router -m 0700 /var/lib/connection-router
COPY --from=build /opt/connection-router /opt/connection-router
ENV PATH=/opt/connection-router/bin:$PATH
# The C extensions are optional at install (setup.py): an image without them would log events
# through the slower Python recorder, parse openings in Python, serve on the Python fast path and
# format its lines in Python. Checked from / against the installed package: no source tree on
# sys.path can answer for them.
RUN cd / && python -c "import event_format._native, keys._native, router.datapath._core, router._conn_lines, router.features.workers._zone"

USER router
WORKDIR /var/lib/connection-router
VOLUME ["/var/lib/connection-router"]
# Documentation only (publish with -p): 61616 is Artemis's all-protocol port (the Kubernetes
# ConfigMap's acceptor), 1883 MQTT (the compose demo's acceptor), 9180 the admin API (reachable
# from outside only when bound wider than loopback, with tokens). Your broker.xml's acceptors decide.
EXPOSE 61616 1883 9180
# Liveness: the process answers on its admin API (python's urllib: the slim image has no curl).
# /healthz, not /readyz: a pool without its quorum is no reason to call the container unhealthy.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9180/healthz', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["routerd"]
CMD ["--config", "/etc/connection-router/broker.xml", "--admin", "127.0.0.1:9180", "--state-file", "/var/lib/connection-router/state.json"]
