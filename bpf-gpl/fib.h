// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Forwarding: fib_approve() (the ifstate-ready gate) and forward_or_drop(), the
// common exit of the main, allowed and new-flow programs.

#ifndef __CALI_FIB_H__
#define __CALI_FIB_H__

#include "tc.h"
#include "ifstate.h"
#include "routes.h"
#include "conntrack.h"

/* May this packet be forwarded straight to ifindex?  A flow both sides have
 * approved (CONFIRMED) may.  Otherwise the egress interface must be known in
 * cali_iface, and if it is a workload its programs must be attached for this
 * family (READY): until then the attach-gap rules in the host stack are the
 * only guard, and a direct redirect would bypass them. */
static CALI_BPF_INLINE bool fib_approve(struct cali_tc_ctx *ctx, __u32 ifindex)
{
	if (ct_result_is_confirmed(ctx->state->ct_result.rc))
		return true;

	struct ifstate_val *val = cali_iface.lookup(&ifindex);

	if (!val) {
		CALI_DEBUG("FIB: ifindex %d not in cali_iface: not approved", ifindex);
		return false;
	}
	if (val->flags & IFACE_STATE_NOT_MANAGED)
		return true;
	if ((val->flags & IFACE_STATE_WEP) && !(val->flags & IFACE_STATE_READY)) {
		CALI_DEBUG("FIB: workload ifindex %d not ready: not approved", ifindex);
		ctx->mark |= CALI_SKB_MARK_SKIP_FIB;
		return false;
	}
	return true;
}

#ifndef IPVER6
static CALI_BPF_INLINE int ip_dec_ttl(struct __sk_buff *skb)
{
	__u8 ttl;
	__u32 off = CALI_ETH_HLEN + __builtin_offsetof(struct iphdr, ttl);

	if (bpf_skb_load_bytes(skb, off, &ttl, 1))
		return -1;
	if (ttl <= 1)
		return -1;
	/* The checksum covers the 16-bit word holding ttl (high byte) and protocol. */
	__be16 old = bpf_htons((__u16)ttl << 8), new = bpf_htons((__u16)(ttl - 1) << 8);
	__u8 nttl = ttl - 1;

	bpf_l3_csum_replace(skb, CALI_ETH_HLEN + __builtin_offsetof(struct iphdr, check), old, new, 2);
	bpf_skb_store_bytes(skb, off, &nttl, 1, 0);
	return 0;
}
#else
static CALI_BPF_INLINE int ip_dec_ttl(struct __sk_buff *skb)
{
	__u8 hl;
	__u32 off = CALI_ETH_HLEN + __builtin_offsetof(struct ipv6hdr, hop_limit);

	if (bpf_skb_load_bytes(skb, off, &hl, 1))
		return -1;
	if (hl <= 1)
		return -1;
	hl--;
	bpf_skb_store_bytes(skb, off, &hl, 1, 0);
	return 0;
}
#endif

/* Established flows approved by both sides go straight into the destination
 * workload's namespace.  Never for a TCP SYN: the destination's program must
 * see (and force policy on) every SYN. */
static CALI_BPF_INLINE bool try_redirect_to_peer(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;

	if (!(GLOBAL_FLAGS(ctx) & CALI_GLOBALS_REDIRECT_PEER))
		return false;
	if (ct_result_rc(s->ct_result.rc) != CALI_CT_ESTABLISHED_BYPASS)
		return false;
	if (is_tcp_syn(s))
		return false;
	if (s->ct_result.flags & CALI_CT_FLAG_SKIP_REDIR_PEER)
		return false;
	if (s->ct_result.ifindex_fwd == CT_INVALID_IFINDEX)
		return false;

	struct cali_rt *rt = cali_rt_lookup(&s->ip_dst);

	if (!rt || !cali_rt_flags_local_workload(rt->flags) ||
	    (rt->flags & CALI_RT_SKIP_INGRESS_REDIRECT) ||
	    rt->if_index != s->ct_result.ifindex_fwd)
		return false;

	if (ip_dec_ttl(ctx->skb))
		return false;

	int rc = cali_redirect_peer(s->ct_result.ifindex_fwd, 0);

	if (rc == TC_ACT_REDIRECT) {
		CALI_DEBUG("redirect_peer to ifindex %d", s->ct_result.ifindex_fwd);
		COUNTER_INC(ctx, CALI_REASON_REDIRECT_PEER);
		ctx->res = TC_ACT_REDIRECT;
		return true;
	}
	return false;
}

static CALI_BPF_INLINE void fib_forward(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;
	struct bpf_fib_lookup *p = &ctx->globals->fib;

	__builtin_memset(p, 0, sizeof(*p));
#ifdef IPVER6
	p->family = 10; /* AF_INET6 */
	__builtin_memcpy(p->ipv6_src, &s->ip_src, 16);
	__builtin_memcpy(p->ipv6_dst, &s->ip_dst, 16);
#else
	p->family = 2; /* AF_INET */
	p->ipv4_src = s->ip_src;
	p->ipv4_dst = s->ip_dst;
#endif
	p->l4_protocol = s->ip_proto;
	p->sport = bpf_htons(s->sport);
	p->dport = bpf_htons(s->dport);
	p->tot_len = s->ip_size;
	p->ifindex = ctx->skb->ifindex;

	int rc = bpf_fib_lookup(ctx->skb, p, sizeof(*p), CALI_FIB_LOOKUP_SKIP_NEIGH);

	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* Local delivery, no route, ...: let the host stack decide. */
		CALI_DEBUG("FIB lookup rc=%d: to host stack", rc);
		return;
	}
	if (!fib_approve(ctx, p->ifindex)) {
		deny_reason(ctx, CALI_REASON_WEP_NOT_READY);
		return;
	}
	if (ip_dec_ttl(ctx->skb)) {
		/* TTL expired: the host stack generates the ICMP error. */
		return;
	}
	rc = cali_redirect_neigh(p->ifindex, NULL, 0, 0);
	if (rc == TC_ACT_REDIRECT) {
		CALI_DEBUG("redirect_neigh to ifindex %d", p->ifindex);
		COUNTER_INC(ctx, CALI_REASON_REDIRECT_NEIGH);
		ctx->res = TC_ACT_REDIRECT;
	}
}

/* Final verdict.  Packets heading into the host carry the SEEN mark so the
 * programs they meet next (and iptables) know a BPF program approved them. */
static CALI_BPF_INLINE int forward_or_drop(struct cali_tc_ctx *ctx)
{
	if (ctx->res == TC_ACT_SHOT) {
		COUNTER_INC(ctx, ctx->reason);
		CALI_DEBUG("final: DROP reason %d", ctx->reason);
		return TC_ACT_SHOT;
	}

	if (CALI_F_TO_HOST) {
		__u32 mark = ctx->mark;
		bool fall_through = mark == CALI_SKB_MARK_FALLTHROUGH;

		bool nat_out = !fall_through && (ctx->state->flags & CALI_ST_NAT_OUTGOING);

		if (nat_out) {
			/* The host stack must see it: MASQUERADE is iptables'/nft's. */
			mark = CALI_SKB_MARK_NAT_OUT;
		} else if (!fall_through) {
			mark |= CALI_SKB_MARK_SEEN;
			/* Both legs approved: programs further along may skip the packet. */
			if (ct_result_rc(ctx->state->ct_result.rc) == CALI_CT_ESTABLISHED_BYPASS &&
			    !is_tcp_syn(ctx->state) && mark == CALI_SKB_MARK_SEEN)
				mark = CALI_SKB_MARK_BYPASS;
		}
		ctx->skb->mark = mark;

		if (!fall_through && !nat_out && !(ctx->state->flags & CALI_ST_SKIP_FIB)) {
			if (!try_redirect_to_peer(ctx))
				fib_forward(ctx);
		}
		if (ctx->res == TC_ACT_SHOT) {
			COUNTER_INC(ctx, ctx->reason);
			CALI_DEBUG("final: DROP reason %d", ctx->reason);
			return TC_ACT_SHOT;
		}
	} else if (ctx->mark) {
		ctx->skb->mark = ctx->mark;
	}
	CALI_DEBUG("final: res %d mark 0x%x", ctx->res, ctx->skb->mark);
	return ctx->res;
}

#endif /* __CALI_FIB_H__ */
