// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// The per-program context: pointers to this packet's state (slot 0 of
// cali_state), the attach-point globals copied there by the preamble (slot 1)
// and this interface's counters, plus the forwarding decision being built.

#ifndef __CALI_TC_H__
#define __CALI_TC_H__

#include "bpf.h"
#include "types.h"
#include "counters.h"
#include "jump.h"
#include "log.h"

struct cali_tc_ctx {
	struct __sk_buff *skb;
	struct cali_tc_state *state;
	struct cali_tc_globals *globals;
	struct cali_counters_val *counters;
	int res;		/* verdict being built: TC_ACT_* */
	__u32 mark;		/* skb->mark to set on the way out (0 = leave) */
	int reason;		/* enum calico_reason for a drop */
};

/* Build the context; drop when state, globals or counters are missing (a
 * packet that cannot be accounted for is never let through). */
#define DECLARE_TC_CTX(NAME, SKB)						\
	struct cali_tc_ctx NAME = {};						\
	do {									\
		NAME.skb = (SKB);						\
		NAME.state = state_get();					\
		if (!NAME.state)						\
			return TC_ACT_SHOT;					\
		NAME.globals = state_get_globals_tc();				\
		if (!NAME.globals)						\
			return TC_ACT_SHOT;					\
		NAME.counters = counters_get((SKB)->ifindex);			\
		if (!NAME.counters)						\
			return TC_ACT_SHOT;					\
		NAME.res = TC_ACT_UNSPEC;					\
	} while (0)

static CALI_BPF_INLINE void deny_reason(struct cali_tc_ctx *ctx, int reason)
{
	ctx->reason = reason;
	ctx->res = TC_ACT_SHOT;
}

#define GLOBAL_FLAGS(ctx) ((ctx)->globals->data.flags)
/* The attach point's egress DSCP (an endpoint's QoS DSCP, on the hook its traffic leaves by: a
 * workload's from-WEP, a host endpoint's to-HEP), -1 for none. */
#define EGRESS_DSCP(ctx) ((ctx)->globals->data.dscp)

/* Tail-call the generic sub-program at logical index idx; returns only if the
 * slot is empty. */
static CALI_BPF_INLINE void cali_jump_to(struct cali_tc_ctx *ctx, __u32 idx)
{
	CALI_DEBUG("jump to idx %d slot %d", idx, ctx->globals->data.jumps[idx]);
	cali_progs.call(ctx->skb, ctx->globals->data.jumps[idx]);
}

#define CALI_JUMP_TO(ctx, index) cali_jump_to(ctx, PROG_PATH(index))

/* The cb[] continuation convention: before tail-calling the per-endpoint policy
 * program the caller writes
 *   cb[0] = slot of the program to continue with on allow,
 *   cb[1] = slot of the program to continue with on deny,
 *   cb[2] = the policy entry slot (felixpy addition: a policy split over
 *           several sub-programs finds part k at cb[2] + k*10000, so one policy
 *           program can be shared by every endpoint with the same rules).
 * Returns only if the policy slot is empty; the caller decides what that
 * means (fail closed on workloads). */
static CALI_BPF_INLINE void cali_jump_to_policy(struct cali_tc_ctx *ctx)
{
	volatile struct cali_tc_global_data *d = &ctx->globals->data;

	ctx->skb->cb[0] = d->jumps[PROG_PATH(PROG_INDEX_ALLOWED)];
	ctx->skb->cb[1] = d->jumps[PROG_PATH(PROG_INDEX_DROP)];
	ctx->skb->cb[2] = d->jumps[PROG_INDEX_POLICY];
	CALI_DEBUG("jump to policy slot %d", d->jumps[PROG_INDEX_POLICY]);
	cali_jump.call(ctx->skb, d->jumps[PROG_INDEX_POLICY]);
}

#define CALI_JUMP_TO_POLICY(ctx) cali_jump_to_policy(ctx)

#endif /* __CALI_TC_H__ */
