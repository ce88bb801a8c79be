#!/usr/bin/env bash
# Installs what the router, its demo and its tests need on a Debian machine, idempotently:
# the Debian packages of the real components (mosquitto, ActiveMQ, RabbitMQ, ZooKeeper, and
# Prometheus with promtool for the metrics, dashboard and alert tests), Apache ActiveMQ Artemis
# and its Java client from Maven Central into .cache/artemis/ (the tests' Artemis brokers), and a
# venv at .venv with the project installed editable with its test extras. Re-running it is
# cheap: each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."

# systemd: systemd-analyze checks deploy/systemd's unit; procps: pidof and kill of the docs' examples;
# prometheus: promtool and a real Prometheus for the metrics, dashboard and alert tests;
# gcc, libc6-dev, python3-dev: the C extensions (setup.py: the event log's native recorder, the
# MQTT/STOMP CONNECT parsers) and the benchmark's tools.
# valgrind: callgrind and callgrind_control, the benchmark's instructions per connection.
# libjolokia-core-java, libjetty9-java, libservlet-api-java: Jolokia for the tests' ActiveMQ brokers
# (Debian's activemq leaves out upstream's web console and its Jolokia; tests/conftest.py).
APT_PACKAGES=(mosquitto haproxy iperf3 gcc libc6-dev python3-dev valgrind activemq libactivemq-java libmqtt-client-java libjolokia-core-java libjetty9-java libservlet-api-java openjdk-17-jdk-headless rabbitmq-server zookeeper systemd procps prometheus)
# Maven fetches Artemis (install_artemis); any mvn on the PATH will do.
command -v mvn >/dev/null || APT_PACKAGES+=(maven)

# Apache ActiveMQ Artemis (Apache-2.0) for the tests' Artemis brokers (tests/conftest.py): the
# distribution, extracted, and the standalone JMS/CORE client jar, with slf4j-simple (MIT) so that
# a client run with `java -cp` logs instead of warning that it has no SLF4J provider.
ARTEMIS_VERSION=2.40.0
ARTEMIS_DIR=.cache/artemis
ARTEMIS_ARTIFACTS=(
    "org.apache.activemq:apache-artemis:$ARTEMIS_VERSION:tar.gz:bin"
    "org.apache.activemq:artemis-jms-client-all:$ARTEMIS_VERSION"
    "org.slf4j:slf4j-simple:2.0.17"
)

log() { printf 'bootstrap: %s\n' "$*" >&2; }

need_python() {
    python3 - <<'PY' || { log "Python >= 3.11 is required (found $(python3 --version 2>&1))"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY
}

install_apt() {
    local missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { log "need root (or sudo) to install: ${missing[*]}"; exit 1; }
        sudo=(sudo)
    fi
    log "installing Debian packages: ${missing[*]}"
    "${sudo[@]}" apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
        "${missing[@]}" >/dev/null
}

install_venv() {
    local stamp=.venv/.installed stamp_value
    # The C sources are built in place by the editable install: a change to one installs again.
    stamp_value=$(cat pyproject.toml setup.py event_format/_native.c event_format/_native_program.h keys/_native.c router/datapath/_core.c router/_conn_lines.c router/features/workers/_zone.c | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && [ -x .venv/bin/routerd ] \
        && .venv/bin/python -c "import event_format._native, keys._native, router.datapath._core, router._conn_lines, router.features.workers._zone" 2>/dev/null; then
        return 0
    fi
    [ -x .venv/bin/python ] || { log "creating .venv"; python3 -m venv .venv; }
    log "installing the project and its test tools into .venv"
    .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -m pip install -q -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import router, trio, lxml, paho.mqtt, pytest" \
        || { log "the venv is incomplete; see pip's output above"; exit 1; }
    .venv/bin/python -c "import event_format._native" \
        || log "the event log's native recorder did not build (a C compiler and Python's headers are needed); routerd uses the Python one"
    .venv/bin/python -c "import keys._native" \
        || log "the C CONNECT parsers (keys._native) did not build (a C compiler and Python's headers are needed); tests/keys/test_native.py will fail"
    .venv/bin/python -c "import router.datapath._core" \
        || log "the native data path's C core (router.datapath._core) did not build (a C compiler and Python's headers are needed); routerd serves with --data-path python"
    .venv/bin/python -c "import router._conn_lines" \
        || log "the C line buffer (router._conn_lines) did not build (a C compiler and Python's headers are needed); routerd formats its per-connection lines in Python"
    .venv/bin/python -c "import router.features.workers._zone" \
        || log "the workers' zone (router.features.workers._zone) did not build (a C compiler and Python's headers are needed); tests/router/features/workers will fail"
    echo "$stamp_value" > "$stamp"
}

install_artemis() {
    local stamp=$ARTEMIS_DIR/.installed stamp_value home=$ARTEMIS_DIR/apache-artemis-$ARTEMIS_VERSION
    stamp_value="${ARTEMIS_ARTIFACTS[*]}"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && [ -x "$home/bin/artemis" ] \
        && [ -f "$ARTEMIS_DIR/artemis-jms-client-all-$ARTEMIS_VERSION.jar" ]; then
        return 0
    fi
    mkdir -p "$ARTEMIS_DIR"
    log "downloading Apache ActiveMQ Artemis $ARTEMIS_VERSION and its client jar with Maven into $ARTEMIS_DIR"
    local artifact out=$ARTEMIS_DIR/mvn.log
    for artifact in "${ARTEMIS_ARTIFACTS[@]}"; do
        # -U: Maven otherwise remembers a failed download in ~/.m2 and does not try again for a day.
        if ! mvn -q -B -U dependency:copy "-Dartifact=$artifact" "-DoutputDirectory=$ARTEMIS_DIR" >"$out" 2>&1; then
            sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -m 1 'ERROR' >&2 || true  # Debian's mvn colours even with -B
            log "could not download $artifact from Maven Central with mvn (whole output: $out);"
            log "check the network and any proxy or mirror in ~/.m2/settings.xml, then run this again"
            exit 1
        fi
    done
    rm -rf "$home" "$home.partial"
    mkdir "$home.partial"
    tar -xzf "$ARTEMIS_DIR/apache-artemis-$ARTEMIS_VERSION-bin.tar.gz" -C "$home.partial" --strip-components=1 \
        || { log "could not extract $ARTEMIS_DIR/apache-artemis-$ARTEMIS_VERSION-bin.tar.gz"; exit 1; }
    mv "$home.partial" "$home"  # whole or not at all: an interrupted run extracts again
    rm -f "$out"
    echo "$stamp_value" > "$stamp"
}

need_python
install_apt
install_artemis
install_venv
