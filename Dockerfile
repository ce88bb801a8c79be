# connection-router: runs `routerd` as a non-root user with the configuration mounted.
#   docker build -t connection-router .
#   docker run -v $PWD/broker.xml:/etc/connection-router/broker.xml:ro -p 61616:61616 connection-router
# The admin API (lookup, drain, cache, /metrics) listens on the container's loopback only. To reach
# it from outside, give it tokens (lines NAME LEVEL TOKEN, docs/operations.md) and bind it wider:
#   docker run … -v $PWD/admin-tokens:/etc/connection-router/admin-tokens:ro -p 9180:9180 connection-router \
#     --config /etc/connection-router/broker.xml --admin 0.0.0.0:9180 \
#     --admin-tokens /etc/connection-router/admin-tokens
# (routerd refuses a non-loopback --admin without --admin-tokens.)
FROM python:3.11-slim

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin router

WORKDIR /opt/connection-router
COPY pyproject.toml setup.py README.md ./
COPY router ./router
COPY keys ./keys
COPY pools ./pools
COPY policies ./policies
COPY cache ./cache
COPY tls_sni ./tls_sni
COPY event_format ./event_format
COPY pipeline ./pipeline
# gcc for the event log's native recorder (setup.py), removed once it is built.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir . \
    && python -c "import event_format._native" \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* /root/.cache

USER router
STOPSIGNAL SIGTERM
ENTRYPOINT ["routerd"]
CMD ["--config", "/etc/connection-router/broker.xml", "--admin", "127.0.0.1:9180"]
