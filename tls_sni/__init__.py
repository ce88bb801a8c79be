"""TLS ClientHello parsing for SNI (a leaf package: imports nothing of ours, does no I/O).

The SNI_HOST key type reads `server_name` from the ClientHello; the parser arrives with the
protocol-aware keys. Until then the router resolves SNI_HOST to `NULL` on plain TCP.
"""
