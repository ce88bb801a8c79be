"""TLS ClientHello parsing for SNI (a leaf package: imports nothing of ours, does no I/O).

The SNI_HOST key type reads `server_name` from the ClientHello of a passthrough TLS connection.
`parse_client_hello` is a pure function of the bytes received so far (None: read more;
`ValueError`: not TLS); `keys.tls` adapts it to the sniffer contract of `keys.sniff`.
"""

from tls_sni.clienthello import ClientHello as ClientHello
from tls_sni.clienthello import parse_client_hello as parse_client_hello
from tls_sni.clienthello import starts_like_tls_record as starts_like_tls_record
