"""The pure core of the router: decisions and bookkeeping without I/O, clock or logging.

Nothing here imports trio or socket (ruff `banned-api`); times come in as arguments.
"""
