// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// XDP sub-programs for host endpoints (untracked policy only):
//   calico_xdp_main                 parse, failsafes, tail-call the policy
//   calico_xdp_accepted_entrypoint  policy allowed: tell TC (metadata), pass
//   calico_xdp_drop                 policy denied: drop
// A policy that neither allows nor denies returns XDP_PASS itself; a missing
// policy program means pass.  Headers are read with direct packet access.

#include "bpf.h"
#include "log.h"
#include "types.h"
#include "jump.h"
#include "counters.h"
#include "failsafe.h"
#include "metadata.h"

struct cali_xdp_ctx {
	struct xdp_md *xdp;
	struct cali_tc_state *state;
	struct cali_xdp_globals *globals;
	struct cali_counters_val *counters;
};

#define DECLARE_XDP_CTX(NAME, XDP)						\
	struct cali_xdp_ctx NAME = {};						\
	do {									\
		NAME.xdp = (XDP);						\
		NAME.state = state_get();					\
		NAME.globals = state_get_globals_xdp();				\
		NAME.counters = counters_get((XDP)->ingress_ifindex);		\
		if (!NAME.state || !NAME.globals || !NAME.counters)		\
			return XDP_PASS;					\
	} while (0)

static CALI_BPF_INLINE void xdp_jump_to(struct cali_xdp_ctx *ctx, __u32 idx)
{
	cali_progs.call(ctx->xdp, ctx->globals->jumps[idx]);
}

static CALI_BPF_INLINE void xdp_jump_to_policy(struct cali_xdp_ctx *ctx)
{
	cali_jump.call(ctx->xdp, ctx->globals->jumps[PROG_INDEX_POLICY]);
}

/* Fill state from the packet; returns 0, or the reason for dropping it. */
static CALI_BPF_INLINE int xdp_parse(struct cali_xdp_ctx *ctx)
{
	void *data = (void *)(long)ctx->xdp->data;
	void *data_end = (void *)(long)ctx->xdp->data_end;
	struct cali_tc_state *s = ctx->state;
	__u32 l4;

	if (data + sizeof(struct ethhdr) > data_end)
		return CALI_REASON_SHORT;
#ifdef IPVER6
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);

	if ((void *)(ip6 + 1) > data_end)
		return CALI_REASON_SHORT;
	if (ip6->version != 6)
		return CALI_REASON_IP_MALFORMED;
	__builtin_memcpy(&s->ip_src, &ip6->saddr, 16);
	__builtin_memcpy(&s->ip_dst, &ip6->daddr, 16);
	s->ip_proto = ip6->nexthdr;
	l4 = sizeof(struct ethhdr) + sizeof(*ip6);
#else
	struct iphdr *ip = data + sizeof(struct ethhdr);

	if ((void *)(ip + 1) > data_end)
		return CALI_REASON_SHORT;
	if (ip->version != 4 || ip->ihl < 5)
		return CALI_REASON_IP_MALFORMED;
	s->ip_src = ip->saddr;
	s->ip_dst = ip->daddr;
	s->ip_proto = ip->protocol;
	if (ip->frag_off & bpf_htons(0x1fff)) {
		/* No L4 header: match on addresses only. */
		s->ip_proto = 0;
		return 0;
	}
	l4 = sizeof(struct ethhdr) + ip->ihl * 4;
#endif
	s->pre_nat_ip_dst = s->ip_dst;
	s->post_nat_ip_dst = s->ip_dst;
	if (l4 > 1500)
		return CALI_REASON_IP_MALFORMED;

	switch (s->ip_proto) {
	case IPPROTO_TCP: {
		struct tcphdr *tcp = data + l4;

		if ((void *)(tcp + 1) > data_end)
			return CALI_REASON_SHORT;
		s->sport = bpf_ntohs(tcp->source);
		s->dport = bpf_ntohs(tcp->dest);
		break;
	}
	case IPPROTO_UDP: {
		struct udphdr *udp = data + l4;

		if ((void *)(udp + 1) > data_end)
			return CALI_REASON_SHORT;
		s->sport = bpf_ntohs(udp->source);
		s->dport = bpf_ntohs(udp->dest);
		break;
	}
	case IPPROTO_ICMP_46: {
		__u8 *icmp = data + l4;

		if ((void *)(icmp + 4) > data_end)
			return CALI_REASON_SHORT;
		s->icmp_type = icmp[0];
		s->icmp_code = icmp[1];
		break;
	}
	}
	s->pre_nat_dport = s->dport;
	s->post_nat_dport = s->dport;
	return 0;
}

int calico_xdp_main(struct xdp_md *xdp)
{
	DECLARE_XDP_CTX(_ctx, xdp);
	struct cali_xdp_ctx *ctx = &_ctx;
	struct cali_tc_state *s = ctx->state;

	__builtin_memset(s, 0, sizeof(*s));
	ctx->counters->c[COUNTER_TOTAL_PACKETS]++;

	void *data = (void *)(long)xdp->data;
	void *data_end = (void *)(long)xdp->data_end;

	if (data + sizeof(struct ethhdr) > data_end)
		return XDP_PASS;
	if (((struct ethhdr *)data)->h_proto != bpf_htons(CALI_ETH_P))
		return XDP_PASS;

	int reason = xdp_parse(ctx);
	if (reason) {
		CALI_DEBUG("XDP: malformed packet, reason %d: DROP", reason);
		if (reason < MAX_COUNTERS_SIZE)
			ctx->counters->c[reason]++;
		return XDP_DROP;
	}

	if (is_failsafe_in(s->ip_proto, s->dport, s->ip_src) ||
	    is_failsafe_out(s->ip_proto, s->sport, s->ip_src)) {
		CALI_DEBUG("XDP: failsafe: PASS");
		ctx->counters->c[CALI_REASON_ACCEPTED_BY_FAILSAFE]++;
		return XDP_PASS;
	}

	xdp_jump_to_policy(ctx);
	CALI_DEBUG("XDP: no policy program: PASS");
	return XDP_PASS;
}

int calico_xdp_accepted_entrypoint(struct xdp_md *xdp)
{
	DECLARE_XDP_CTX(_ctx, xdp);
	struct cali_xdp_ctx *ctx = &_ctx;

	ctx->counters->c[CALI_REASON_ACCEPTED_BY_POLICY]++;
#ifndef CALI_XDP_NO_METADATA
	/* Tell TC the packet was accepted by untracked policy. */
	if (bpf_xdp_adjust_meta(xdp, -(int)sizeof(struct cali_metadata)) == 0) {
		void *meta = (void *)(long)xdp->data_meta;
		void *data = (void *)(long)xdp->data;

		if (meta + sizeof(struct cali_metadata) <= data)
			((struct cali_metadata *)meta)->flags = CALI_META_ACCEPTED_BY_XDP;
	}
#endif
	/* (Built with CALI_XDP_NO_METADATA where the kernel refuses bpf_xdp_adjust_meta: TC then
	 * applies the tracked policy to the packet as to any other; stricter, never more open.) */
	CALI_DEBUG("XDP: accepted by policy: PASS");
	return XDP_PASS;
}

int calico_xdp_drop(struct xdp_md *xdp)
{
	DECLARE_XDP_CTX(_ctx, xdp);
	struct cali_xdp_ctx *ctx = &_ctx;

	ctx->counters->c[CALI_REASON_DROPPED_BY_POLICY]++;
	CALI_DEBUG("XDP: denied by policy: DROP");
	return XDP_DROP;
}
