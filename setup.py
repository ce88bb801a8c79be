"""The one thing pyproject.toml cannot say without a warning: the event log's native recorder.

It is optional, so an install without a C compiler (or the Python headers) works; routerd then logs
through the Python recorder, which costs routing more (docs/event-log.md). `./run-tests` checks it
is built.
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
        )
    ]
)
