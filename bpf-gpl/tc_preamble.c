// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// cali_tc_preamble: the only program attached to a TC hook.  It looks up this
// attach point's globals (cali_ap_glob, keyed by ifindex and hook), picks the
// IPv4 or IPv6 half by ethertype (falling back to the other family when one is
// not loaded), copies it into state slot 1 for the rest of the chain, then
// tail-calls the log filter if one is installed (cb[0] = fast main, cb[1] =
// debug main) or else the fast main, then the debug main.  Anything missing:
// drop.

#include "bpf.h"
#include "log.h"
#include "types.h"
#include "globals.h"
#include "jump.h"

int cali_tc_preamble(struct __sk_buff *skb)
{
	struct cali_ap_key k = {};

	k.ifindex = skb->ifindex;
	k.hook = CALI_HOOK;

	struct cali_tc_preamble_globals *pg = cali_ap_glob.lookup(&k);
	if (!pg)
		return TC_ACT_SHOT;

	struct cali_tc_globals *g = state_get_globals_tc();
	if (!g)
		return TC_ACT_SHOT;

	struct cali_tc_global_data *src;

	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		src = &pg->v6;
		if (src->jumps[PROG_INDEX_MAIN] == ~0U)
			src = &pg->v4;
	} else {
		src = &pg->v4;
		if (src->jumps[PROG_INDEX_MAIN] == ~0U)
			src = &pg->v6;
	}
	if (src->jumps[PROG_INDEX_MAIN] == ~0U)
		return TC_ACT_SHOT;

	__builtin_memcpy(&g->data, src, sizeof(g->data));

	if (g->data.log_filter_jmp != ~0U) {
		skb->cb[0] = g->data.jumps[PROG_INDEX_MAIN];
		skb->cb[1] = g->data.jumps[PROG_INDEX_MAIN_DEBUG];
		cali_jump.call(skb, g->data.log_filter_jmp);
	}
	cali_progs.call(skb, g->data.jumps[PROG_INDEX_MAIN]);
	cali_progs.call(skb, g->data.jumps[PROG_INDEX_MAIN_DEBUG]);
	return TC_ACT_SHOT;
}
