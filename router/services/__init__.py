"""Background services of a running router: health probes, ZooKeeper discovery, the admin API and
the connection-TTL checks."""
