// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Per-interface, per-hook packet counters (cali_counters6).  Key host order;
// value: per-CPU u64[MAX_COUNTERS_SIZE] indexed by enum calico_reason.  Felix
// pre-creates each entry before attaching; a program that finds no entry drops
// the packet (it cannot account for it).

#ifndef __CALI_COUNTERS_H__
#define __CALI_COUNTERS_H__

#include "bpf.h"
#include "reasons.h"

struct cali_counters_key {
	__u32 ifindex;
	__u32 hook;		/* 0 TC ingress, 1 TC egress, 2 XDP */
};

struct cali_counters_val {
	__u64 c[MAX_COUNTERS_SIZE];
};

CALI_STATIC_ASSERT(sizeof(struct cali_counters_val) == 216, "counters value");

CALI_MAP(cali_counters, cali_counters6, "percpu_hash", struct cali_counters_key, struct cali_counters_val,
	 20000, 0);

static CALI_BPF_INLINE struct cali_counters_val *counters_get(__u32 ifindex)
{
	struct cali_counters_key k = {};

	k.ifindex = ifindex;
	k.hook = CALI_HOOK;
	return cali_counters.lookup(&k);
}

/* Reason 0 is the total-packets counter, bumped once per packet by the main
 * program; an unset (0) drop reason is therefore never counted twice. */
#define COUNTER_INC(ctx, reason) do {						\
	int __r = (reason);							\
	if (__r > 0 && __r < MAX_COUNTERS_SIZE)					\
		(ctx)->counters->c[__r]++;					\
} while (0)

#define COUNTER_INC_TOTAL(ctx) ((ctx)->counters->c[COUNTER_TOTAL_PACKETS]++)

#endif /* __CALI_COUNTERS_H__ */
