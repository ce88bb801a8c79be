"""The two data paths, which carry out what the core decides: the trio path (one task per
connection) and the fast path (an epoll thread), with their I/O helpers."""
