"""The image the deployment files run (the repository's Dockerfile) can be built: it copies every
package pyproject.toml installs (`pip install .` fails on a missing one), and routerctl, which the
Kubernetes preStop hook runs, is installed with routerd."""

from __future__ import annotations

import tomllib

from tests.deploy.conftest import ROOT, dockerfile

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_image_copies_every_installed_package() -> None:
    top_level = {name.split(".")[0] for name in PYPROJECT["tool"]["setuptools"]["packages"]}
    copied = dockerfile().copied
    assert {"pyproject.toml", "setup.py", "README.md"} <= copied  # the build reads them
    assert sorted(top_level - copied) == []


def test_image_installs_routerd_and_routerctl() -> None:
    image = dockerfile()
    scripts = PYPROJECT["project"]["scripts"]
    assert image.entrypoint == ("routerd",)
    assert {"routerd", "routerctl"} <= set(scripts)
