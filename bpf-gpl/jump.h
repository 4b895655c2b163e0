// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Tail-call plumbing.
//
// Two prog arrays per kernel hook:
//   cali_progs_{ing,egr}2  generic sub-programs (main, allowed, drop, new-flow,
//                          ...), fast and debug builds at distinct slots;
//   cali_jump_{ing,egr}2   per-endpoint policy programs and log filters.
// The directions are separate maps because a prog array holds programs of one
// type/attach type only (TCX on kernels >= 6.12 makes that per direction).
// XDP has its own pair: xdp_cali_progs3 / xdp_cali_jump3.
//
// globals.jumps[] maps a *logical* index (enum cali_jump_index) to the
// *physical* slot in the generic array, except jumps[PROG_INDEX_POLICY], which
// is this interface's entry slot in the policy array.

#ifndef __CALI_BPF_JUMP_H__
#define __CALI_BPF_JUMP_H__

#include "bpf.h"
#include "types.h"

CALI_MAP(cali_state, cali_state6, "percpu_array", __u32, struct cali_state_blob, 2, 0);

static CALI_BPF_INLINE struct cali_tc_state *state_get(void)
{
	__u32 key = 0;

	return (struct cali_tc_state *)cali_state.lookup(&key);
}

static CALI_BPF_INLINE struct cali_tc_globals *state_get_globals_tc(void)
{
	__u32 key = 1;

	return (struct cali_tc_globals *)cali_state.lookup(&key);
}

static CALI_BPF_INLINE struct cali_xdp_globals *state_get_globals_xdp(void)
{
	__u32 key = 1;

	return (struct cali_xdp_globals *)cali_state.lookup(&key);
}

/* Add new values at the end: these are program indices. */
enum cali_jump_index {
	PROG_INDEX_MAIN,
	PROG_INDEX_POLICY,
	PROG_INDEX_ALLOWED,
	PROG_INDEX_ICMP,
	PROG_INDEX_DROP,
	PROG_INDEX_HOST_CT_CONFLICT,
	PROG_INDEX_ICMP_INNER_NAT,
	PROG_INDEX_NEW_FLOW,
	PROG_INDEX_IP_FRAG,
	PROG_INDEX_MAGLEV,
	PROG_INDEX_TCP_RST,

	PROG_INDEX_MAIN_DEBUG,
	PROG_INDEX_POLICY_DEBUG,
	PROG_INDEX_ALLOWED_DEBUG,
	PROG_INDEX_ICMP_DEBUG,
	PROG_INDEX_DROP_DEBUG,
	PROG_INDEX_HOST_CT_CONFLICT_DEBUG,
	PROG_INDEX_ICMP_INNER_NAT_DEBUG,
	PROG_INDEX_NEW_FLOW_DEBUG,
	PROG_INDEX_IP_FRAG_DEBUG,
	PROG_INDEX_MAGLEV_DEBUG,
	PROG_INDEX_TCP_RST_DEBUG,
};

CALI_STATIC_ASSERT(PROG_INDEX_MAIN_DEBUG == 11, "debug offset");

/* A packet on the debug path stays on it. */
#define PROG_PATH(idx) ((CALI_LOG_LEVEL < CALI_LOG_LEVEL_DEBUG) ? (idx) : (idx##_DEBUG))

#if CALI_F_XDP
CALI_MAP(cali_progs, xdp_cali_progs3, "prog", __u32, __u32, 400, 0);
CALI_MAP(cali_jump, xdp_cali_jump3, "prog", __u32, __u32, 2400, 0);
#elif CALI_HOOK == CALI_HOOK_INGRESS
CALI_MAP(cali_progs, cali_progs_ing2, "prog", __u32, __u32, 400, 0);
CALI_MAP(cali_jump, cali_jump_ing2, "prog", __u32, __u32, 240000, 0);
#else
CALI_MAP(cali_progs, cali_progs_egr2, "prog", __u32, __u32, 400, 0);
CALI_MAP(cali_jump, cali_jump_egr2, "prog", __u32, __u32, 240000, 0);
#endif

#endif /* __CALI_BPF_JUMP_H__ */
