"""The test tree mirrors the source tree (STYLE R9): every module `X/Y.py` has `tests/X/test_Y.py`.

Modules that may still lack a test file are listed in `NOT_YET_TESTED`. The list only shrinks: a
listed module that gains a test file, or no longer exists, fails the layout test until it is taken
off the list.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "keys", "pools", "policies", "cache", "tls_sni", "event_format", "pipeline")

NOT_YET_TESTED = frozenset(
    {
        "router/__main__.py",
    }
)


def source_modules() -> list[str]:
    """Every module of the packages (subpackages included) except `__init__.py`, as posix paths."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def expected_test_file(module: str) -> Path:
    """`X/Y.py` -> `tests/X/test_Y.py` (and `X/sub/Y.py` -> `tests/X/sub/test_Y.py`)."""
    path = Path(module)
    return ROOT / "tests" / path.parent / f"test_{path.name}"


def test__expected_test_file():
    assert expected_test_file("keys/resolve.py") == ROOT / "tests/keys/test_resolve.py"
    assert expected_test_file("router/__main__.py") == ROOT / "tests/router/test___main__.py"
    assert expected_test_file("router/schema/load.py") == ROOT / "tests/router/schema/test_load.py"


def test_layout_packages_exist():
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package


def test_layout_finds_known_modules():
    modules = source_modules()
    for known in ["keys/resolve.py", "policies/policy.py", "router/core/engine.py", "cache/cache.py"]:
        assert known in modules


def test_layout_every_module_has_test_file():
    missing = [
        f"{module} -> {expected_test_file(module).relative_to(ROOT).as_posix()}"
        for module in source_modules()
        if module not in NOT_YET_TESTED and not expected_test_file(module).is_file()
    ]
    assert missing == [], "modules without a test file (STYLE R9)"


def test_layout_not_yet_tested_modules_exist():
    gone = sorted(module for module in NOT_YET_TESTED if not (ROOT / module).is_file())
    assert gone == [], "listed in NOT_YET_TESTED but no such module: remove them from the list"


def test_layout_not_yet_tested_modules_still_lack_tests():
    tested = sorted(module for module in NOT_YET_TESTED if expected_test_file(module).is_file())
    assert tested == [], "these modules now have a test file: remove them from NOT_YET_TESTED"


# -- the layers of router/ and the import direction (router/__init__.py) -------------------------

ROUTER_LAYERS = (
    ("router.logs", "router.conn_lines"),
    ("router.config",),
    ("router.core",),
    ("router.ctl_output", "router.ctl_client", "router.ctl_render"),
    ("router.metric_values", "router.storm_metrics", "router.metrics", "router.reports"),
    ("router.runtime",),
    ("router.datapath",),
    ("router.feature", "router.processes"),
    ("router.services",),
    ("router.features",),
    ("router.acceptors", "router.kept_files", "router.reload", "router.router_tasks"),
    ("router.server",),
    ("router.cli", "router.ctl", "router.ctl_commands", "router.__main__"),
)
"""Lowest first: a module may import from its own layer and the ones before it, never after."""

PURE_PACKAGES = tuple(package for package in PACKAGES if package not in ("router", "pipeline"))
"""`pipeline/` sits below `router/`: it reads the event records and replays the router's engine."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Every module a source file imports (`TYPE_CHECKING` imports included): `from pkg import name`
    is `pkg.name` when that is one of `modules`, else `pkg`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return found


def router_import_graph() -> dict[str, set[str]]:
    """router module -> the router modules it imports."""
    files = {module_name(p): p for p in (ROOT / "router").rglob("*.py")}
    return {
        name: {m for m in imported_modules(path, set(files)) if m in files and m not in (name, "router")}
        for name, path in files.items()
    }


def layer_of(module: str) -> int:
    for rank, prefixes in enumerate(ROUTER_LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer of ROUTER_LAYERS: add it there and to router/__init__.py")


def test_layout_router_imports_go_down_the_layers() -> None:
    upward = [
        f"{module} (layer {layer_of(module)}) imports {imported} (layer {layer_of(imported)})"
        for module, imports in sorted(router_import_graph().items())
        if module != "router"
        for imported in sorted(imports)
        if layer_of(imported) > layer_of(module)
    ]
    assert upward == [], "router/__init__.py: a layer imports only the layers below it"


def test_layout_router_has_no_import_circles() -> None:
    graph = router_import_graph()
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in path:
                circles.append([*path[path.index(imported) :], imported])
            elif imported not in done:
                visit(imported, [*path, imported])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert circles == []


def test_layout_pure_packages_never_import_router() -> None:
    offenders = sorted(
        f"{module_name(path)} imports {m}"
        for package in PURE_PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for m in imported_modules(path, set())
        if m == "router" or m.startswith("router.")
    )
    assert offenders == []


def test_layout_router_never_imports_pipeline() -> None:
    """`pipeline/` replays the router's engine; its routerctl commands reach routerctl through the
    entry point group `connection_router.routerctl` (router/ctl.py), not an import."""
    offenders = sorted(
        f"{module_name(path)} imports {m}"
        for path in (ROOT / "router").rglob("*.py")
        for m in imported_modules(path, set())
        if m == "pipeline" or m.startswith("pipeline.")
    )
    assert offenders == []


def test_layout_import_checks_see_what_they_check() -> None:
    """The checks above would pass vacuously if the graph were empty: it has the known edges."""
    graph = router_import_graph()
    assert "router.core.engine" in graph["router.core.plan"]
    assert "router.core.answers" in graph["router.core.plan"]  # `from router.core import answers`
    assert "router.runtime" in graph["router.datapath.acceptor"]  # a TYPE_CHECKING import
    assert layer_of("router.datapath.fast_path") > layer_of("router.runtime") > layer_of("router.core.live")


# -- features (router/features/, STYLE R13) ---------------------------------------------------------


def feature_of(module: str) -> str | None:
    """`router.features.moves.rules` -> `moves`; None outside a feature's folder."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["router", "features"] else None


def test_layout_features_never_import_each_other() -> None:
    offenders = sorted(
        f"{module} imports {imported}"
        for module, imports in router_import_graph().items()
        if (mine := feature_of(module)) is not None
        for imported in imports
        if (theirs := feature_of(imported)) is not None and theirs != mine
    )
    assert offenders == [], "what two features share belongs in the kernel"


def test_layout_hubs_reach_features_only_through_features_list() -> None:
    """Outside router/features/, only the package itself (its `FEATURES`) is imported, never a
    feature's own module; and the kernel below the hubs imports no feature at all."""
    hubs = {"router.server", "router.cli", "router.ctl", "router.__main__"}
    offenders = sorted(
        f"{module} imports {imported}"
        for module, imports in router_import_graph().items()
        if not module.startswith("router.features")
        for imported in imports
        if imported.startswith("router.features") and (imported != "router.features" or module not in hubs)
    )
    assert offenders == []


PURE_FEATURE_MODULES = (
    "rules.py",
    "records.py",
    "_generated_records.py",
    "sources.py",
    "ring.py",
    "recorder.py",
    "znodes.py",
)
"""The names of a feature's pure modules: its rules, the event log's records, field table, ring
and recorders, and the shared cache's znodes."""


def test_layout_features_pure_modules_are_linted_as_pure() -> None:
    """A feature's pure module is named as `PURE_FEATURE_MODULES` says, and ruff's banned-api rule
    (no trio, socket, select) is waived only for the I/O modules: the pyproject's per-file-ignores
    name no pattern that matches a pure module."""
    import fnmatch
    import tomllib

    ignores = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["per-file-ignores"]
    waived = [pattern for pattern, rules in ignores.items() if "TID251" in rules]
    pure_files = sorted(
        p.relative_to(ROOT).as_posix()
        for name in PURE_FEATURE_MODULES
        for p in (ROOT / "router/features").rglob(name)
    )
    assert "router/features/moves/rules.py" in pure_files, "the check would pass vacuously"
    assert "router/features/event_log/records.py" in pure_files, "the check would pass vacuously"
    for path in pure_files:
        assert not [p for p in waived if fnmatch.fnmatch(path, p)], path


def test_layout_feature_checks_see_what_they_check() -> None:
    graph = router_import_graph()
    assert "router.features" in graph["router.server"]
    assert "router.features.moves.rules" in graph["router.features.moves.service"]
    assert feature_of("router.features.moves.rules") == "moves"
    assert feature_of("router.feature") is None


def test_layout_every_package_is_installed() -> None:
    """A package directory missing from pyproject.toml's list works in the editable install the
    tests use and is missing from a real one (the image, a wheel)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module_name(init) for package in PACKAGES for init in (ROOT / package).rglob("__init__.py")}
    assert sorted(found - listed) == []
