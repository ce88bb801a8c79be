"""Developer tools, run from the repository; nothing here is imported by the router.

Layout:

    generate.py  writes the code the project generates ahead of time and checks that it is up to
                 date: `.venv/bin/python -m tools.generate [--check]`
"""
