// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// cali_xdp_preamble: the program attached to a host interface's XDP hook.
// Looks up the interface's globals (xdp_cali_glob, keyed by ingress ifindex),
// copies the half for the packet's family into state slot 1 and tail-calls the
// XDP main program (fast, or debug when only that is loaded: XDP has no log
// filter).  XDP only carries untracked (DoNotTrack) host-endpoint
// policy, which TC re-checks anyway, so anything missing here passes the packet
// on to TC rather than dropping it.

#include "bpf.h"
#include "types.h"
#include "globals.h"
#include "jump.h"

int cali_xdp_preamble(struct xdp_md *xdp)
{
	void *data = (void *)(long)xdp->data;
	void *data_end = (void *)(long)xdp->data_end;
	__u32 ifindex = xdp->ingress_ifindex;

	struct cali_xdp_preamble_globals *pg = xdp_cali_glob.lookup(&ifindex);
	if (!pg)
		return XDP_PASS;

	struct cali_xdp_globals *g = state_get_globals_xdp();
	if (!g)
		return XDP_PASS;

	if (data + sizeof(struct ethhdr) > data_end)
		return XDP_PASS;

	struct ethhdr *eth = data;
	struct cali_xdp_globals *src = eth->h_proto == bpf_htons(ETH_P_IPV6) ? &pg->v6 : &pg->v4;

	if (src->jumps[PROG_INDEX_MAIN] == ~0U && src->jumps[PROG_INDEX_MAIN_DEBUG] == ~0U)
		return XDP_PASS;
	__builtin_memcpy(g, src, sizeof(*g));
	cali_progs.call(xdp, g->jumps[PROG_INDEX_MAIN]);
	cali_progs.call(xdp, g->jumps[PROG_INDEX_MAIN_DEBUG]);
	return XDP_PASS;
}
