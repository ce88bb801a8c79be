"""The image the deployment files run (the repository's Dockerfile), checked as far as a machine
without Docker allows (issue 34):

- the Dockerfile read: a base pinned by its full version; the state file in a directory the image
  makes for its user and declares a VOLUME; EXPOSE of the ports the deployment files use; a
  HEALTHCHECK on the admin API's /healthz with what the slim image has (python); the native
  recorder checked from outside any source tree; every package pyproject.toml installs copied;
- `.dockerignore` read as Docker reads it: the build context is exactly the Dockerfile's sources,
  without .git, .venv, tests, caches or a compiled extension of the working tree;
- the image's build and checks run against what it installs (integration): a wheel of the build
  context (`pip wheel --no-deps`, as the image's build stage builds it) installed into a venv of
  its own, the native-recorder check run in a directory that holds a source tree with a planted
  extension (it must not answer for the install), and routerd from that venv started with the
  image's CMD (the configuration on a read-only mount) while the HEALTHCHECK's command, verbatim,
  asks its admin API, in a network namespace of their own (so that 127.0.0.1:9180 is free).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.deploy.conftest import COMPOSE, KUBERNETES, ROOT, dockerfile, parse, yaml_documents

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DOCKERIGNORE = ROOT / ".dockerignore"
IMAGE = dockerfile()
ROUTERD = parse([*IMAGE.entrypoint, *IMAGE.cmd])
PINNED_BASE = re.compile(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?")
"""A base pinned by its full Python version (a digest may follow); `python:3.11-slim`, a bare
`python` or `:latest` move under the image between two builds."""
NATIVE_CHECK = "import event_format._native, keys._native, router.datapath._core, router._conn_lines"
HEALTH_URL = re.compile(
    r"urlopen\('http://(?P<host>[^:/']+):(?P<port>\d+)(?P<path>/[^']*)', timeout=(?P<timeout>\d+)\)"
)


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match is not None, f"expected N s, got {duration!r}"
    return float(match.group(1))


# -- the Dockerfile -------------------------------------------------------------------------------


def test_image_copies_every_installed_package() -> None:
    top_level = {name.split(".")[0] for name in PYPROJECT["tool"]["setuptools"]["packages"]}
    assert {"pyproject.toml", "setup.py", "README.md"} <= IMAGE.copied  # the build reads them
    assert sorted(top_level - IMAGE.copied) == []


def test_image_installs_routerd_and_routerctl() -> None:
    scripts = PYPROJECT["project"]["scripts"]
    assert IMAGE.entrypoint == ("routerd",)
    assert {"routerd", "routerctl"} <= set(scripts)


def test_image_base_is_pinned_by_its_full_version() -> None:
    """Every stage has the same pinned base: the venv built in the first runs in the last."""
    assert IMAGE.bases, "no FROM"
    for base in IMAGE.bases:
        assert PINNED_BASE.fullmatch(base), f"FROM {base}: pin python:3.11.N-slim-bookworm"
    assert len(set(IMAGE.bases)) == 1
    assert sys.version_info[:2] == (3, 11)  # what the tests run is the image's Python minor


def test_image_base_check_would_catch_an_unpinned_base() -> None:
    for base in ("python:3.11-slim", "python:3.11-slim-bookworm", "python:latest", "python"):
        assert not PINNED_BASE.fullmatch(base), base


def test_image_keeps_its_state_file_in_a_volume_of_its_user() -> None:
    """Scenario (issue 34): the CMD's --state-file is in a directory the image makes, owned by the
    user it runs as, and declares a VOLUME (writable under a read-only root file system); beside
    the configuration, mounted read-only, a drain would answer 500."""
    assert ROUTERD.state_file is not None, "the CMD sets no --state-file"
    state_dir = str(PurePosixPath(ROUTERD.state_file).parent)
    assert state_dir != str(PurePosixPath(ROUTERD.config).parent)
    assert state_dir in IMAGE.volumes
    assert IMAGE.workdir == state_dir  # relative paths of broker.xml land there too (as systemd's)
    made = [
        match.groups()
        for run in IMAGE.runs
        for match in re.finditer(r"install -d -o (\S+) -g (\S+)(?: -m (\d+))? (\S+)", run)
    ]
    assert (IMAGE.user, IMAGE.user) in {(owner, group) for owner, group, _, path in made if path == state_dir}
    assert re.search(rf"useradd [^&]*--uid {IMAGE.uid} [^&]* {IMAGE.user}\b", " ".join(IMAGE.runs))


def test_image_exposes_the_admin_port_and_the_deployments_client_ports() -> None:
    exposed = IMAGE.exposed
    assert ROUTERD.admin[1] in exposed
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml_documents(path):
            for container in (
                document.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            ):
                assert {p["containerPort"] for p in container["ports"]} <= exposed, path.name
    (compose,) = yaml_documents(COMPOSE)
    published = {int(p.rsplit(":", 1)[1]) for p in compose["services"]["routerd"]["ports"]} - {9090}
    assert published <= exposed  # 9090 is Prometheus's, which shares routerd's network


def test_image_healthcheck_asks_healthz_on_the_cmds_admin_address() -> None:
    """python's urllib (the slim image has no curl) against /healthz (liveness: a pool without its
    quorum does not make the container unhealthy) on the CMD's --admin, within the check's timeout."""
    command = IMAGE.healthcheck
    assert command[:2] == ("python", "-c")
    match = HEALTH_URL.search(command[2])
    assert match is not None, command
    assert (match["host"], int(match["port"])) == ROUTERD.admin
    assert match["path"] == "/healthz"
    options = IMAGE.healthcheck_options
    assert set(options) == {"interval", "timeout", "start-period", "retries"}
    assert float(match["timeout"]) < _seconds(options["timeout"]) <= _seconds(options["interval"])
    assert int(options["retries"]) >= 2  # one slow answer is not a verdict
    assert _seconds(options["start-period"]) >= 5


def test_image_checks_the_native_recorder_from_outside_a_source_tree() -> None:
    """Scenario (issue 34): the check of the optional C recorder runs from /, in the image's stage,
    which copies no source tree from the build context (the build stage does): only the installed
    package can answer it."""
    (check,) = [run for run in IMAGE.runs if NATIVE_CHECK in run]
    assert check.startswith("cd / && python -c ")
    final_stage = IMAGE.instructions[-1].stage
    copies = [i.arguments for i in IMAGE.instructions if i.stage == final_stage and i.keyword == "COPY"]
    assert copies, "the image copies the build stage's venv"
    assert all(c.startswith("--from=") for c in copies), copies
    assert final_stage > 0
    assert not any(
        i.keyword == "RUN" and "gcc" in i.arguments for i in IMAGE.instructions if i.stage == final_stage
    )


# -- .dockerignore --------------------------------------------------------------------------------


def _glob_regex(pattern: str) -> str:
    """A .dockerignore pattern (Go's filepath.Match with `**`) as a regular expression."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out) + r"\Z"


@dataclass(frozen=True, slots=True)
class DockerIgnore:
    """A .dockerignore as Docker reads it: a path is left out of the build context when the last
    pattern that matches it or one of its parent directories is not a `!` exception."""

    patterns: tuple[tuple[bool, re.Pattern[str]], ...]

    @classmethod
    def read(cls, text: str) -> DockerIgnore:
        patterns = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
            patterns.append((keep, re.compile(_glob_regex(pattern))))
        return cls(tuple(patterns))

    def sends(self, path: str) -> bool:
        """Whether `path` (relative to the context, `/`-separated) is in the build context."""
        parts = path.split("/")
        candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        sent = True
        for keep, regex in self.patterns:
            if any(regex.match(candidate) for candidate in candidates):
                sent = keep
        return sent


IGNORE = DockerIgnore.read(DOCKERIGNORE.read_text())


def _tracked_files() -> list[str]:
    result = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [name for name in result.stdout.decode().split("\0") if name]


def _copied(path: str) -> bool:
    return any(path == source or path.startswith(f"{source}/") for source in IMAGE.copied)


def test_dockerignore_matcher_reads_patterns_as_docker_does() -> None:
    ignore = DockerIgnore.read("*\n!src\n**/__pycache__\n**/*.so\n# note\n/build\n")
    assert not ignore.sends("tests/x.py")
    assert not ignore.sends(".git/HEAD")
    assert ignore.sends("src/a/b.py")
    assert not ignore.sends("src/a/__pycache__/b.pyc")
    assert not ignore.sends("src/_native.cpython-311-x86_64-linux-gnu.so")
    assert not ignore.sends("build/lib/x.py")
    assert DockerIgnore.read("").sends("anything/at/all")


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        ".git",
        "tests/deploy/test_image.py",
        "benchmarks/README.md",
        "fuzz/README.md",
        "docs/operations.md",
        ".cache/pip/x",
        ".pytest_cache/v/x",
        ".mypy_cache/3.11/x.json",
        ".hypothesis/examples/x",
        "build/lib.linux-x86_64-cpython-311/event_format/_native.cpython-311-x86_64-linux-gnu.so",
        "dist/connection_router-0.1.0-cp311-cp311-linux_x86_64.whl",
        "connection_router.egg-info/PKG-INFO",
        "demo-run/routerd.log",
        "event_format/_native.cpython-311-x86_64-linux-gnu.so",
        "router/__pycache__/cli.cpython-311.pyc",
        "router/features/admin_states/__pycache__/service.cpython-311.pyc",
    ],
)
def test_dockerignore_leaves_out(path: str) -> None:
    assert not IGNORE.sends(path)


def test_dockerignore_sends_exactly_the_dockerfiles_sources() -> None:
    """Every tracked file the Dockerfile copies is in the context, and no other."""
    tracked = _tracked_files()
    assert "router/cli.py" in tracked
    assert "tests/conftest.py" in tracked
    wrong = [path for path in tracked if IGNORE.sends(path) != _copied(path)]
    assert wrong == []


# -- the image's checks against an installed wheel (integration) ---------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Installed:
    """The build context as the image gets it, and a venv with the wheel built from it."""

    context: Path
    venv: Path
    native: Path
    """The installed native recorder (event_format/_native*.so in the venv)."""

    def env(self) -> dict[str, str]:
        """The image's environment: its venv first on PATH (the Dockerfile's ENV PATH), and no
        PYTHONPATH (the test's own may point at the working tree)."""
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
        return {**env, "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def _build_context(target: Path) -> None:
    """Copy what the Dockerfile copies, as .dockerignore lets it into the context."""
    for source in sorted(IMAGE.copied):
        origin = ROOT / source
        files = [origin] if origin.is_file() else sorted(p for p in origin.rglob("*") if p.is_file())
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            if IGNORE.sends(relative):
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target / relative)


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """`pip wheel --no-deps` of the build context, installed into a venv of its own. Its
    dependencies come from the test's own environment (a .pth line: no download); the project
    itself only from the wheel."""
    top = tmp_path_factory.mktemp("image")
    context, dist, venv = top / "context", top / "dist", top / "venv"
    _build_context(context)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(context)])
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("connection_router-*.whl")
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    put = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    assert put.returncode == 0, put.stdout + put.stderr
    purelib = Path(
        _run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    (purelib / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (native,) = (purelib / "event_format").glob("_native*.so")
    return Installed(context=context, venv=venv, native=native)


@pytest.mark.integration
def test_image_native_check_passes_against_the_installed_wheel_only(installed: Installed) -> None:
    """Scenario (issue 34): the image's check, run where a source tree with a compiled extension
    is the working directory (the old Dockerfile's WORKDIR held the copied tree): it passes with
    the installed recorder, and fails without it although the tree's is there; the same import
    without `cd /` would have passed on the tree's."""
    (check,) = [run for run in IMAGE.runs if NATIVE_CHECK in run]
    tree = installed.context
    planted = tree / "event_format" / installed.native.name
    shutil.copy2(installed.native, planted)  # as an editable install builds it in place
    purelib = installed.native.parent.parent
    others = [  # the other extensions, planted too: the negative control imports them all
        next((purelib / folder).glob(f"{name}*.so"))
        for folder, name in (
            ("keys", "_native"),
            ("router/datapath", "_core"),
            ("router", "_conn_lines"),
            ("router/features/workers", "_zone"),
        )
    ]
    planted_others = [tree / other.relative_to(purelib) for other in others]
    for other, planted_other in zip(others, planted_others, strict=True):
        shutil.copy2(other, planted_other)
    aside = installed.native.with_name("native.aside")
    try:
        passed = _run(["sh", "-c", check], cwd=tree, env=installed.env())
        assert passed.returncode == 0, passed.stderr
        installed.native.rename(aside)
        failed = _run(["sh", "-c", check], cwd=tree, env=installed.env())
        assert failed.returncode != 0
        assert "No module named 'event_format._native'" in failed.stderr
        fooled = _run(["sh", "-c", check.removeprefix("cd / && ")], cwd=tree, env=installed.env())
        assert fooled.returncode == 0, "the negative control: the tree answers an import run in it"
    finally:
        if aside.exists():
            aside.rename(installed.native)
        planted.unlink()
        for planted_other in planted_others:
            planted_other.unlink()
    version = _run(["routerd", "--version"], cwd="/", env=installed.env())
    assert version.returncode == 0, version.stderr
    assert (
        str(installed.venv)
        in _run(
            ["python", "-c", "import router; print(router.__file__)"], cwd="/", env=installed.env()
        ).stdout
    )


_DRIVER = """
import json, subprocess, sys, time
spec = json.loads(sys.argv[1])
results = []
for argv in spec["runs"]:
    proc = subprocess.Popen(argv, env=spec["env"], cwd=spec["cwd"], stderr=subprocess.PIPE, text=True)
    healthy = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if subprocess.run(spec["health"], env=spec["env"], capture_output=True, timeout=10).returncode == 0:
            healthy = True
            break
        time.sleep(0.2)
    proc.terminate()
    try:
        _, log = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, log = proc.communicate()
    after = subprocess.run(spec["health"], env=spec["env"], capture_output=True, timeout=10).returncode
    results.append({"healthy": healthy, "after_exit": after, "exit": proc.returncode, "log": log})
print(json.dumps(results))
"""


@pytest.mark.integration
def test_image_cmd_starts_without_warnings_and_answers_its_healthcheck(
    installed: Installed, tmp_path: Path
) -> None:
    """Scenario (issue 34): routerd of the installed wheel with the image's CMD (its configuration
    and state directories mapped to the test's, the configuration's mounted read-only) answers the
    HEALTHCHECK's command, run verbatim, and says nothing of its state file; without --state-file
    (the former CMD) it warns at start that the state file beside the configuration cannot be
    written. After routerd's exit the check fails. In a network and mount namespace of their own."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    config_dir = PurePosixPath(ROUTERD.config).parent
    state_dir = PurePosixPath(ROUTERD.state_file).parent
    mapped = {str(config_dir): tmp_path / "config", str(state_dir): tmp_path / "state"}
    for directory in mapped.values():
        directory.mkdir()
    shutil.copy2(COMPOSE.parent / "broker.xml", mapped[str(config_dir)] / PurePosixPath(ROUTERD.config).name)

    def mapped_argv(argv: tuple[str, ...]) -> list[str]:
        out = []
        for word in argv:
            for image_dir, here in mapped.items():
                if word.startswith(f"{image_dir}/"):
                    word = str(here / word.removeprefix(f"{image_dir}/"))
            out.append(word)
        return out

    program = shutil.which(IMAGE.entrypoint[0], path=installed.env()["PATH"])
    assert program == str(installed.venv / "bin" / IMAGE.entrypoint[0])  # the wheel's routerd
    cmd = mapped_argv(IMAGE.cmd)
    without_state_file = list(cmd)
    del without_state_file[cmd.index("--state-file") : cmd.index("--state-file") + 2]
    spec = {
        "runs": [[*IMAGE.entrypoint, *cmd], [*IMAGE.entrypoint, *without_state_file]],
        "health": list(IMAGE.healthcheck),
        "env": installed.env(),
        "cwd": str(mapped[str(state_dir)]),
    }
    conf = shlex.quote(str(mapped[str(config_dir)]))
    script = (
        f"{{ ip link set lo up && mount --bind {conf} {conf} && mount -o remount,bind,ro {conf}; }} "
        "|| exit 77; "
        f"exec {shlex.quote(sys.executable)} -c {shlex.quote(_DRIVER)} {shlex.quote(json.dumps(spec))}"
    )
    result = _run(["unshare", "--net", "--mount", "sh", "-c", script])
    if result.returncode == 77 or (result.returncode != 0 and result.stderr.startswith("unshare:")):
        pytest.skip(f"no network and mount namespace here (needs CAP_SYS_ADMIN): {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    image_run, former_run = json.loads(result.stdout)
    for run in (image_run, former_run):
        assert run["healthy"], run["log"]
        assert run["exit"] == 0, run["log"]
        assert run["after_exit"] != 0
    assert "WARNING" not in "".join(
        line for line in image_run["log"].splitlines(keepends=True) if "state file" in line
    ), image_run["log"]
    default = mapped[str(config_dir)] / "broker-state.json"
    assert (
        f"WARNING router.server: state file {str(default)!r} cannot be written: its directory "
        f"{mapped[str(config_dir)]} is on a read-only filesystem" in former_run["log"]
    ), former_run["log"]
