"""What the tests of deploy/prometheus and deploy/grafana share: a real Prometheus (the Debian
package's binary) on a loopback port chosen at run time, scraping routerd, with rule files."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Final

import pytest
import yaml

from tests.conftest import eventually, free_port, stop_process

if TYPE_CHECKING:
    from pathlib import Path

SCRAPE_INTERVAL_S: Final = 1
PROMETHEUS_START_S: Final = 30.0


class Prometheus:
    """The Debian package's Prometheus on 127.0.0.1, with its storage in a temporary directory."""

    def __init__(self, workdir: Path, scrape_targets: list[str], rule_files: list[Path]) -> None:
        self.port = free_port()
        self.dir = workdir
        self.config = workdir / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                        "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                        "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
                    },
                    "rule_files": [str(path) for path in rule_files],
                    "scrape_configs": [
                        {"job_name": "routerd", "static_configs": [{"targets": scrape_targets}]}
                    ],
                }
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: run ./run-tests, which installs the prometheus package")
        with open(self.dir / "prometheus.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        if not eventually(self._ready, PROMETHEUS_START_S):
            self.stop()
            raise TimeoutError(
                f"prometheus not ready after {PROMETHEUS_START_S} s: see {self.dir / 'prometheus.log'}"
            )

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"prometheus exited with {self.proc.returncode}: see {self.dir / 'prometheus.log'}"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a successful HTTP API answer."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar) of an expression now; empty when it has no data."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"value": data["result"]}]
        result = data["result"]
        assert isinstance(result, list)
        return result

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self.proc = None
