"""What pyproject.toml cannot say without a warning: the C extensions.

- `event_format._native`, the event log's native recorder;
- `keys._native`, the MQTT and STOMP CONNECT parsers (keys/native.py wraps them);
- `router.datapath._core`, the native data path's C core (router/datapath/native_path.py drives it);
- `router._conn_lines`, the per-connection INFO lines formatted in C (router/conn_lines.py);
- `router.features.workers._zone`, the workers' shared zone (router/features/workers/zone.py).

All are optional, so an install without a C compiler (or the Python headers) works; routerd then
logs through the Python recorder, which costs routing more (docs/event-log.md), and keys/native.py
falls back to the Python sniffers, the Python fast path serves instead of the C core, and the
lines are formatted in Python.
`./run-tests` checks they are built.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "event_format._native",
            sources=["event_format/_native.c"],
            depends=["event_format/_native_program.h"],  # generated: python -m tools.generate
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=True,
        ),
        Extension(
            "keys._native",
            sources=["keys/_native.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=True,
        ),
        Extension(
            "router.datapath._core",
            sources=["router/datapath/_core.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=True,
        ),
        Extension(
            "router.features.workers._zone",
            sources=["router/features/workers/_zone.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=True,
        ),
        Extension(
            "router._conn_lines",
            sources=["router/_conn_lines.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=True,
        ),
    ]
)
