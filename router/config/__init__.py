"""Configuration: the `broker.xml` loader, the dataclasses it builds (`settings`), the value kinds
and the one wording of each rule (`values`), the acceptor URL parameter table (`acceptor_params`),
and pool passwords. No I/O besides reading the file (and a password's environment variable or file).
"""

from router.config.loader import SECTIONS as SECTIONS
from router.config.loader import ConfigError as ConfigError
from router.config.loader import load_config as load_config
from router.config.loader import load_config_text as load_config_text
