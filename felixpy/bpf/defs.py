"""Constants shared between the C programs (``bpf-gpl/``) and Python.

Each group names the C header it mirrors; a test (``tests/bpf/test_defs_match_c.py``) parses the
headers and checks every value here against them, so the two cannot drift.
"""

from __future__ import annotations

import enum

# --- bpf.h: CALI_COMPILE_FLAGS bits ------------------------------------------------------------
TC_HOST_EP = 1 << 0
TC_INGRESS = 1 << 1
TC_TUNNEL = 1 << 2
CGROUP = 1 << 3
TC_DSR = 1 << 4
TC_L3_DEV = 1 << 5
XDP_PROG = 1 << 6
TC_NAT_IF = 1 << 7
TC_LO = 1 << 8
CT_CLEANUP = 1 << 9
TC_VXLAN = 1 << 10
TC_PREAMBLE = 1 << 11
TC_DEF_POLICY = 1 << 12

# --- bpf.h: log levels ------------------------------------------------------------------------
LOG_LEVEL_OFF = 0
LOG_LEVEL_INFO = 5
LOG_LEVEL_DEBUG = 10

# --- bpf.h: TC / XDP verdicts ------------------------------------------------------------------
TC_ACT_UNSPEC = 0xFFFFFFFF  # -1 as the u32 TEST_RUN reports it
TC_ACT_OK = 0
TC_ACT_SHOT = 2
TC_ACT_REDIRECT = 7
XDP_ABORTED = 0
XDP_DROP = 1
XDP_PASS = 2

# --- bpf.h: skb mark bits (enum calico_skb_mark) -----------------------------------------------
MARK_SEEN = 0x01000000
MARK_SEEN_MASK = MARK_SEEN
MARK_BYPASS = 0x03000000
MARK_BYPASS_MASK = 0x03F00000
MARK_BYPASS_FWD = 0x03300000
MARK_BYPASS_XDP = 0x03500000
MARK_FALLTHROUGH = 0x05000000
MARK_NAT_OUT = 0x03800000
MARK_MASQ = 0x03600000
MARK_SKIP_FIB = 0x01100000
MARK_CT_ESTABLISHED = 0x08000000
MARK_CT_ESTABLISHED_MASK = 0x08000000


# --- jump.h: logical sub-program indices (enum cali_jump_index) --------------------------------
class ProgIndex(enum.IntEnum):
    MAIN = 0
    POLICY = 1
    ALLOWED = 2
    ICMP = 3
    DROP = 4
    HOST_CT_CONFLICT = 5
    ICMP_INNER_NAT = 6
    NEW_FLOW = 7
    IP_FRAG = 8
    MAGLEV = 9
    TCP_RST = 10


PROG_INDEX_DEBUG_OFFSET = 11  # PROG_INDEX_MAIN_DEBUG
JUMPS_LEN = 40  # globals.jumps[]
JUMP_UNUSED = 0xFFFFFFFF

# Generic prog-array sizes and the per-endpoint policy layout (jump.h).
PROGS_MAP_SIZE = 400
TC_JUMP_MAP_SIZE = 240000
XDP_PROGS_MAP_SIZE = 400
XDP_JUMP_MAP_SIZE = 2400
TC_POLICY_STRIDE = 10000  # sub-program k of entry e lives at e + k*stride
XDP_POLICY_STRIDE = 100
MAX_POLICY_SUBPROGS = 24

# --- policy.h: policy verdicts written to state->pol_rc ---------------------------------------
POL_NO_MATCH = 0
POL_ALLOW = 1
POL_DENY = 2
POL_TAIL_CALL_FAILED = 10


# --- reasons.h: counter indices (enum calico_reason) -------------------------------------------
class Reason(enum.IntEnum):
    TOTAL_PACKETS = 0
    ACCEPTED_BY_FAILSAFE = 1
    ACCEPTED_BY_POLICY = 2
    BYPASS = 3
    DROPPED_BY_POLICY = 4
    SHORT = 5
    CSUM_FAIL = 6
    IP_OPTIONS = 7
    IP_MALFORMED = 8
    ENCAP_FAIL = 9
    DECAP_FAIL = 10
    UNAUTH_SOURCE = 11
    RT_UNKNOWN = 12
    BLACK_HOLE = 13
    SOURCE_COLLISION = 14
    SOURCE_COLLISION_FAILED = 15
    CT_CREATE_FAILED = 16
    REDIRECT = 17
    REDIRECT_NEIGH = 18
    REDIRECT_PEER = 19
    FRAG_WAIT = 20
    FRAG_REORDER = 21
    FRAG_UNSUPPORTED = 22
    DROPPED_BY_QOS = 23
    RESERVED_24 = 24
    MAGLEV_NO_BACKEND = 25
    NO_HOST_IP = 26


MAX_COUNTERS = 27

# Counter hook keys.
HOOK_TC_INGRESS = 0
HOOK_TC_EGRESS = 1
HOOK_XDP = 2


# --- conntrack_types.h ---------------------------------------------------------------------------
class CtType(enum.IntEnum):
    NORMAL = 0
    NAT_FWD = 1
    NAT_REV = 2


class CtResult(enum.IntEnum):
    NEW = 0
    MID_FLOW_MISS = 1
    ESTABLISHED = 2
    ESTABLISHED_BYPASS = 3
    ESTABLISHED_SNAT = 4
    ESTABLISHED_DNAT = 5
    INVALID = 6
    MAGLEV_MID_FLOW_MISS = 7


CT_RES_RELATED = 0x100
CT_RES_RPF_FAILED = 0x200
CT_RES_TUN_SRC_CHANGED = 0x400
CT_RES_SYN = 0x1000
CT_RES_CONFIRMED = 0x2000
CT_RES_TO_WORKLOAD = 0x4000

CT_FLAG_NAT_OUT = 0x1
CT_FLAG_SKIP_FIB = 0x8
CT_FLAG_BA = 0x100
CT_FLAG_SKIP_REDIR_PEER = 0x4000
CT_FLAG_SET_DSCP = 0x8000

# --- types.h: state flags (enum cali_state_flags) ---------------------------------------------
ST_NAT_OUTGOING = 0x01
ST_SKIP_FIB = 0x02
ST_DEST_IS_HOST = 0x04
ST_SRC_IS_HOST = 0x08
ST_SUPPRESS_CT_STATE = 0x10
ST_SKIP_POLICY = 0x20
ST_SET_DSCP = 0x40
ST_LOG_PACKET = 0x400

# --- ifstate.h ------------------------------------------------------------------------------------
IFACE_STATE_WEP = 0x1
IFACE_STATE_V4_READY = 0x2
IFACE_STATE_V6_READY = 0x4
IFACE_STATE_HEP = 0x8
IFACE_STATE_BOND = 0x10
IFACE_STATE_BOND_SLAVE = 0x20
IFACE_STATE_VXLAN = 0x40
IFACE_STATE_IPIP = 0x80
IFACE_STATE_WIREGUARD = 0x100
IFACE_STATE_L3 = 0x200
IFACE_STATE_NOT_MANAGED = 0x400

# --- routes.h (enum cali_rt_flags) ---------------------------------------------------------------
RT_IN_POOL = 0x1
RT_NAT_OUT = 0x2
RT_WORKLOAD = 0x4
RT_LOCAL = 0x8
RT_HOST = 0x10
RT_SAME_SUBNET = 0x20
RT_TUNNELED = 0x40
RT_NO_DSR = 0x80
RT_BLACKHOLE_DROP = 0x100
RT_BLACKHOLE_REJECT = 0x200
RT_VXLAN = 0x400
RT_SKIP_INGRESS_REDIRECT = 0x800

# --- failsafe.h ------------------------------------------------------------------------------------
FSAFE_OUT = 1

# --- globals.h (enum cali_globals_flags) ---------------------------------------------------------
GLOBALS_RPF_OPTION_ENABLED = 0x10
GLOBALS_RPF_OPTION_STRICT = 0x20
GLOBALS_NO_DSR_CIDRS = 0x80
GLOBALS_LO_UDP_ONLY = 0x100
GLOBALS_REDIRECT_PEER = 0x400
GLOBALS_NATOUTGOING_EXCLUDE_HOSTS = 0x1000

# --- metadata.h ------------------------------------------------------------------------------------
META_ACCEPTED_BY_XDP = 0x80

# IP-set id reserved range (ids >= 2**32 are reserved by Felix).
IPSET_ID_RESERVED_BASE = 1 << 32
