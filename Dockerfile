# connection-router: runs `routerd` as a non-root user with the configuration mounted.
#   docker build -t connection-router .
#   docker run -v $PWD/broker.xml:/etc/connection-router/broker.xml:ro -p 61616:61616 -p 9180:9180 connection-router
# The admin API (lookup, /metrics) has no authentication: publish its port only where that is safe.
FROM python:3.11-slim

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin router

WORKDIR /opt/connection-router
COPY pyproject.toml README.md ./
COPY router ./router
COPY keys ./keys
COPY pools ./pools
COPY policies ./policies
COPY cache ./cache
COPY tls_sni ./tls_sni
RUN pip install --no-cache-dir . && rm -rf /root/.cache

USER router
EXPOSE 9180
STOPSIGNAL SIGTERM
ENTRYPOINT ["routerd"]
CMD ["--config", "/etc/connection-router/broker.xml", "--admin", "0.0.0.0:9180"]
