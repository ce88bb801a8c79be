#!/usr/bin/env bash
# Installs what the router, its demo and its tests need on a Debian machine, idempotently:
# the Debian packages of the real components (mosquitto, ActiveMQ, RabbitMQ, ZooKeeper, and
# Prometheus with promtool for the metrics, dashboard and alert tests), and a
# venv at .venv with the project installed editable with its test extras. Re-running it is
# cheap: each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."

# systemd: systemd-analyze checks deploy/systemd's unit; procps: its ExecReload's /bin/kill;
# prometheus: promtool and a real Prometheus for the metrics, dashboard and alert tests;
# gcc, libc6-dev, python3-dev: the event log's native recorder (setup.py) and the benchmark's tools.
APT_PACKAGES=(mosquitto haproxy iperf3 gcc libc6-dev python3-dev activemq libactivemq-java libmqtt-client-java openjdk-17-jdk-headless rabbitmq-server zookeeper systemd procps prometheus)

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
    # The C source is built in place by the editable install: a change to it installs again.
    stamp_value=$(cat pyproject.toml setup.py event_format/_native.c event_format/_native_program.h | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && [ -x .venv/bin/routerd ] \
        && .venv/bin/python -c "import event_format._native" 2>/dev/null; then
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
    echo "$stamp_value" > "$stamp"
}

need_python
install_apt
install_venv
