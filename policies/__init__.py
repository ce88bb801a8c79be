"""Policies that pick a target for a key, registered by their Artemis names (SPEC A3).

Pure decision code: no clock, no I/O.
"""

from policies.hashing import artemis_hash as artemis_hash
from policies.ketama import KETAMA_VNODES as KETAMA_VNODES
from policies.ketama import KetamaRing as KetamaRing
from policies.ketama import ketama_hash as ketama_hash
from policies.policy import MAX_LOAD_FACTOR as MAX_LOAD_FACTOR
from policies.policy import RING_TYPES as RING_TYPES
from policies.policy import ConnectionCountSource as ConnectionCountSource
from policies.policy import ConsistentHashModuloPolicy as ConsistentHashModuloPolicy
from policies.policy import ConsistentHashPolicy as ConsistentHashPolicy
from policies.policy import FirstElementPolicy as FirstElementPolicy
from policies.policy import LeastConnectionsPolicy as LeastConnectionsPolicy
from policies.policy import Policy as Policy
from policies.policy import PolicyConfig as PolicyConfig
from policies.policy import RoundRobinPolicy as RoundRobinPolicy
from policies.policy import SlowStartSource as SlowStartSource
from policies.policy import make_policy as make_policy
from policies.policy import policy_names as policy_names
