"""Pools of targets: connectors, targets, pool configuration and readiness/quorum state.

Pure decision state: no clock, no network. Probing happens in `router/features/probes/service.py`,
which feeds outcomes into `Pool.record_check`; ZooKeeper discovery happens in
`router/features/discovery/service.py`, which feeds each reading of the members into
`Membership.update` and its diff into the pool.
"""

from pools.members import Member as Member
from pools.members import Membership as Membership
from pools.members import MembershipDiff as MembershipDiff
from pools.members import Rejected as Rejected
from pools.members import check_znode_path as check_znode_path
from pools.members import parse_ensemble as parse_ensemble
from pools.members import parse_member as parse_member
from pools.members import znode_name as znode_name
from pools.outlier import BrokerFailure as BrokerFailure
from pools.outlier import Ejection as Ejection
from pools.outlier import OutlierConfig as OutlierConfig
from pools.pool import AdminState as AdminState
from pools.pool import Pool as Pool
from pools.pool import PoolConfig as PoolConfig
from pools.pool import PoolEvent as PoolEvent
from pools.pool import PoolEventKind as PoolEventKind
from pools.pool import PoolKind as PoolKind
from pools.pool import TargetState as TargetState
from pools.pool import ready_node_ids as ready_node_ids
from pools.target import COUNT_SOURCES as COUNT_SOURCES
from pools.target import LOCAL_NODE_ID as LOCAL_NODE_ID
from pools.target import PROBE_KINDS as PROBE_KINDS
from pools.target import Connector as Connector
from pools.target import CountSource as CountSource
from pools.target import Target as Target
from pools.target import parse_url_params as parse_url_params
