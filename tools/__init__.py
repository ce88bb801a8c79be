"""Developer tools, run from the repository; nothing here is imported by the router (the tests and
the benchmarks may).

Layout:

    generate.py  writes the code the project generates ahead of time and checks that it is up to
                 date: `.venv/bin/python -m tools.generate [--check]`
    artemis_instance.py
                 an Artemis instance copied from an `artemis create`d template, its broker.xml
                 and artemis.profile changed: for the test suite's brokers and the benchmark's
"""
