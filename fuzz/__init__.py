"""The coverage-guided fuzz run: atheris over every sniffer, the PROXY header and broker-answer
parsers, the user store and the configuration loader (fuzz/README.md).

Run it with `.venv/bin/python fuzz/run [TARGET ...] [--time SECONDS] [--runs N]`. Layout:

    targets.py   one `fuzz_<name>(data: bytes) -> None` per target and the `TARGETS` registry
    runner.py    the command behind `fuzz/run`: one atheris process per target
    corpus/      the seed corpus of each target, one directory per target

Nothing here is imported by the router; the targets are plain Python (no atheris), so the tests run
them over the seed corpus without the fuzzer.
"""
