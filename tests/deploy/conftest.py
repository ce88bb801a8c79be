"""What the tests of deploy/ share: the repository's paths, the Dockerfile's facts, the routerd and
routerctl command lines the deployment files hold, and the real argument parsers to check them.

Docker, Kubernetes and a running systemd are not on this machine: the files are checked by the
tools that are (systemd-analyze, the JSON schemas of Kubernetes and of the compose
specification), by routerd's own configuration loader and argument parsers, and against each other.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from router.cli import _routerd_parser
from router.ctl import routerctl_parser as _routerctl_parser

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Sequence

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"
SYSTEMD_UNIT = DEPLOY / "systemd" / "connection-router.service"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
PROGRAMS = ("routerd", "routerctl")


@dataclass(frozen=True, slots=True, kw_only=True)
class Instruction:
    """One instruction of a Dockerfile, its continuation lines joined."""

    stage: int
    """Which build stage it belongs to (0: the first FROM's; the last is the image's)."""
    keyword: str
    """`RUN`, `COPY`, … (upper case)."""
    arguments: str


def dockerfile_instructions(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, each with its stage: comment lines (also inside an
    instruction, and whatever they end with) and blank lines left out, `\\` continuations joined."""
    logical: list[str] = []
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            logical.append(" ".join(pending))
            pending = []
    assert not pending, "the Dockerfile ends inside a continued instruction"
    found = []
    stage = -1
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        found.append(Instruction(stage=stage, keyword=keyword, arguments=arguments.strip()))
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Dockerfile:
    """The facts of the repository's Dockerfile the deployment files depend on."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    uid: int
    """The uid of the user it runs as (`useradd --uid`)."""
    user: str
    """The image's USER (a name)."""
    stop_signal: str
    copied: frozenset[str]
    """What its COPY instructions copy from the build context (sources, as written; not `--from`)."""
    bases: tuple[str, ...]
    """The base image of each stage, as written (`FROM IMAGE [AS NAME]`), the image's last."""
    exposed: frozenset[int]
    """Its EXPOSE ports (TCP)."""
    volumes: tuple[str, ...]
    workdir: str
    """The image's WORKDIR (the last stage's last one)."""
    healthcheck: tuple[str, ...]
    """The HEALTHCHECK's command (exec form)."""
    healthcheck_options: dict[str, str]
    """The HEALTHCHECK's options (`interval` -> `30s`, …)."""
    runs: tuple[str, ...]
    """The image's RUN commands (its last stage's), in order."""
    instructions: tuple[Instruction, ...]


def dockerfile() -> Dockerfile:
    text = DOCKERFILE.read_text()
    instructions = dockerfile_instructions(text)
    image = [i for i in instructions if i.stage == instructions[-1].stage]

    def exec_form(arguments: str, what: str) -> tuple[str, ...]:
        value = json.loads(arguments)
        assert isinstance(value, list), f"{what} must be in exec form (a JSON list): {arguments!r}"
        return tuple(str(word) for word in value)

    def only(keyword: str) -> str:
        (found,) = [i.arguments for i in instructions if i.keyword == keyword]
        return found

    uid = re.search(r"useradd .*--uid (\d+)", text)
    assert uid is not None, "the Dockerfile makes its user with useradd --uid"
    copied = frozenset(
        word
        for i in instructions
        if i.keyword == "COPY" and not i.arguments.startswith("--from")
        for word in i.arguments.split()[:-1]
    )
    health = only("HEALTHCHECK")
    options_text, _, command = health.partition("CMD ")
    options = dict(re.findall(r"--([a-z-]+)=(\S+)", options_text))
    exposed = frozenset(
        int(p.split("/")[0]) for i in image if i.keyword == "EXPOSE" for p in i.arguments.split()
    )
    volumes = tuple(v for i in image if i.keyword == "VOLUME" for v in exec_form(i.arguments, "VOLUME"))
    return Dockerfile(
        entrypoint=exec_form(only("ENTRYPOINT"), "ENTRYPOINT"),
        cmd=exec_form(only("CMD"), "CMD"),
        uid=int(uid.group(1)),
        user=only("USER"),
        stop_signal=only("STOPSIGNAL"),
        copied=copied,
        bases=tuple(i.arguments.split()[0] for i in instructions if i.keyword == "FROM"),
        exposed=exposed,
        volumes=volumes,
        workdir=[i.arguments for i in image if i.keyword == "WORKDIR"][-1],
        healthcheck=exec_form(command, "HEALTHCHECK CMD"),
        healthcheck_options=options,
        runs=tuple(i.arguments for i in image if i.keyword == "RUN"),
        instructions=tuple(instructions),
    )


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """`argv` (routerd … or routerctl …) as the real program's argument parser reads it.

    Raises:
        AssertionError: the parser refuses it, with its own error message.
    """
    program = Path(argv[0]).name
    assert program in PROGRAMS, f"not a routerd or routerctl command line: {argv!r}"
    parser = _routerd_parser() if program == "routerd" else _routerctl_parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser.parse_args(list(argv[1:]))
    except SystemExit:
        raise AssertionError(f"{shlex.join(argv)}: {errors.getvalue().strip()}") from None


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every YAML document of a file (an empty one is an error)."""
    documents = list(yaml.safe_load_all(path.read_text()))
    assert documents, f"{path}: no YAML document"
    for document in documents:
        assert isinstance(document, dict), f"{path}: a document is not a mapping"
    return documents


def systemd_directives(path: Path) -> Iterator[tuple[str, str]]:
    """(key, value) of every directive of a unit file, continuation lines joined."""
    logical = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in logical.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            yield key.strip(), value.strip()


def systemd_command_lines(path: Path) -> list[list[str]]:
    """The Exec*= command lines of a unit that run routerd or routerctl."""
    commands = [shlex.split(v) for k, v in systemd_directives(path) if k.startswith("Exec")]
    return [c for c in commands if c and Path(c[0]).name in PROGRAMS]


def kubernetes_containers() -> list[dict[str, Any]]:
    """The containers of every pod template in deploy/kubernetes/."""
    containers = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml_documents(path):
            pod = document.get("spec", {}).get("template", {}).get("spec")
            if pod is not None:
                containers.extend(pod["containers"])
    return containers


def container_command_lines(container: dict[str, Any], image: Dockerfile) -> list[list[str]]:
    """The routerd/routerctl command lines of a Kubernetes container of our image: what it runs
    (its command, else the image's ENTRYPOINT; its args, else the image's CMD) and its exec hooks
    and probes."""
    main = [*(container.get("command") or image.entrypoint), *(container.get("args") or image.cmd)]
    found = [main]
    for hook in (container.get("lifecycle") or {}).values():
        found.append(hook.get("exec", {}).get("command", []))
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        found.append((container.get(probe) or {}).get("exec", {}).get("command", []))
    return [c for c in found if c and Path(c[0]).name in PROGRAMS]


def compose_command_lines(image: Dockerfile) -> list[list[str]]:
    """The routerd/routerctl command lines of the compose file's services built from our Dockerfile."""
    (document,) = yaml_documents(COMPOSE)
    found = []
    for service in document["services"].values():
        if "build" not in service:
            continue
        entrypoint = service.get("entrypoint") or list(image.entrypoint)
        found.append([*entrypoint, *(service.get("command") or image.cmd)])
    return [c for c in found if Path(c[0]).name in PROGRAMS]
