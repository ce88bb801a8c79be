"""`python -m router` runs `routerd`."""

from router.cli import routerd_main

routerd_main()
