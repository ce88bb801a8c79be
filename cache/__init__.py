"""The router's sticky key -> node id cache (SPEC A5). Pure state; the caller passes the time."""

from cache.cache import CacheConfig as CacheConfig
from cache.cache import TargetCache as TargetCache
