"""Protecting the brokers from reconnect storms: per-target connection limits with a bounded queue,
connect-rate limits per target and per acceptor, slow start (rules.py: the pure rules)."""
