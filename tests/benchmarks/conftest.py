"""The benchmark harness is not an installed package: make `import benchmarks` find it here.

`python -m benchmarks.run` runs from the repository root, which puts the root on `sys.path`;
pytest in importlib mode does not, so these tests do.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
