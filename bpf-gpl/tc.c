// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// The TC sub-programs (all but the preamble), specialised per attach point by
// CALI_COMPILE_FLAGS / IPVER6 / CALI_LOG_LEVEL:
//
//   calico_tc_main                     parse, conntrack, decide policy or not,
//                                      tail-call the endpoint's policy program
//   calico_tc_skb_accepted_entrypoint  policy allowed (or skipped): new flows
//                                      go on to NEW_FLOW, others are forwarded
//   calico_tc_skb_new_flow_entrypoint  create/approve conntrack, forward
//   calico_tc_skb_drop                 policy denied
//
// Each is placed in cali_progs_{ing,egr}2 at the slot globals.jumps[] names.

#include "bpf.h"
#include "log.h"
#include "types.h"
#include "tc.h"
#include "jump.h"
#include "counters.h"
#include "parsing.h"
#include "conntrack.h"
#include "routes.h"
#include "ifstate.h"
#include "failsafe.h"
#include "policy.h"
#include "fib.h"
#include "icmp.h"
#include "metadata.h"

static CALI_BPF_INLINE bool is_nd_or_mld(struct cali_tc_state *s)
{
#ifdef IPVER6
	if (s->ip_proto != IPPROTO_ICMPV6)
		return false;
	switch (s->icmp_type) {
	case 130: case 131: case 132: case 133: case 135: case 136:
		return true;
	}
#endif
	return false;
}

#ifdef IPVER6
#define ip_link_local_or_void(ip) \
	(((ip).a & bpf_htonl(0xffc00000)) == bpf_htonl(0xfe800000) || ip_void(ip))
#endif

/* A workload may only send from its own addresses: the source must route to
 * a local workload on this very interface. */
static CALI_BPF_INLINE bool wep_rpf_ok(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;

#ifdef IPVER6
	if (s->ip_proto == IPPROTO_ICMPV6 && ip_link_local_or_void(s->ip_src))
		return true;
#endif
	struct cali_rt *r = cali_rt_lookup(&s->ip_src);

	if (!r || !cali_rt_flags_local_workload(r->flags) || r->if_index != ctx->skb->ifindex) {
		CALI_DEBUG("WEP RPF failed");
		return false;
	}
	return true;
}

/* BPFEnforceRPF on a host endpoint: a new flow arriving here must come from a
 * source the FIB routes back out of this very interface (Strict) or out of
 * some interface (Loose).  The lookup is the reply's: from the packet's
 * destination to its source, as if received on the ingress interface. */
static CALI_BPF_INLINE bool hep_rpf_ok(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;
	struct bpf_fib_lookup *p = &ctx->globals->fib;
	__u32 flags = GLOBAL_FLAGS(ctx);
	__u32 in = ctx->skb->ingress_ifindex;

	if (!(flags & CALI_GLOBALS_RPF_OPTION_ENABLED))
		return true;
#ifdef IPVER6
	if (s->ip_proto == IPPROTO_ICMPV6)
		return true;  /* neighbour discovery and its kin */
#endif
	__builtin_memset(p, 0, sizeof(*p));
#ifdef IPVER6
	p->family = 10; /* AF_INET6 */
	__builtin_memcpy(p->ipv6_src, &s->ip_dst, 16);
	__builtin_memcpy(p->ipv6_dst, &s->ip_src, 16);
#else
	p->family = 2; /* AF_INET */
	p->ipv4_src = s->ip_dst;
	p->ipv4_dst = s->ip_src;
#endif
	p->l4_protocol = s->ip_proto;
	p->sport = bpf_htons(s->dport);
	p->dport = bpf_htons(s->sport);
	p->ifindex = in;

	int rc = bpf_fib_lookup(ctx->skb, p, sizeof(*p), CALI_FIB_LOOKUP_SKIP_NEIGH);

	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH:
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		if (p->ifindex == in)
			return true;
		if (!(flags & CALI_GLOBALS_RPF_OPTION_STRICT) && p->ifindex != 0)
			return true;
		break;
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		/* Not a unicast route back (e.g. the source is one of ours): only a
		 * link-local source talking to this host passes. */
#ifdef IPVER6
		if ((s->ip_src.a & bpf_htonl(0xffc00000)) == bpf_htonl(0xfe800000) &&
		    (s->ip_dst.a & bpf_htonl(0xffc00000)) == bpf_htonl(0xfe800000))
			return true;
#else
		if ((s->ip_src & bpf_htonl(0xffff0000)) == bpf_htonl(0xa9fe0000) &&
		    (s->flags & CALI_ST_DEST_IS_HOST))
			return true;
#endif
		break;
	}
	CALI_DEBUG("HEP RPF failed: fib rc=%d ifindex=%d", rc, p->ifindex);
	return false;
}

static CALI_BPF_INLINE int skip_policy(struct cali_tc_ctx *ctx)
{
	ctx->state->pol_rc = CALI_POL_ALLOW;
	ctx->state->flags |= CALI_ST_SKIP_POLICY;
	CALI_JUMP_TO(ctx, PROG_INDEX_ALLOWED);
	CALI_DEBUG("tail call to ALLOWED failed");
	ctx->res = TC_ACT_SHOT;
	return forward_or_drop(ctx);
}

static CALI_BPF_INLINE int pre_policy_processing(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;

	s->pol_rc = CALI_POL_NO_MATCH;

	if (CALI_F_FROM_WEP && !wep_rpf_ok(ctx)) {
		deny_reason(ctx, CALI_REASON_UNAUTH_SOURCE);
		return forward_or_drop(ctx);
	}

	calico_ct_lookup(ctx);
	if (s->ct_result.flags & CALI_CT_FLAG_SKIP_FIB)
		s->flags |= CALI_ST_SKIP_FIB;  /* a flow the host stack must keep seeing */

	switch (ct_result_rc(s->ct_result.rc)) {
	case CALI_CT_NEW:
		break;
	case CALI_CT_MID_FLOW_MISS:
		if (CALI_F_TO_HOST) {
			/* May belong to a flow that predates us: let iptables decide
			 * (it accepts only flows Linux conntrack knows). */
			CALI_DEBUG("CT mid-flow miss: fall through to iptables");
			ctx->mark = CALI_SKB_MARK_FALLTHROUGH;
			return forward_or_drop(ctx);
		}
		if (CALI_F_HEP) {
			/* Run HEP policy but never create CT state mid-flow; if a HEP
			 * policy allows, ALLOWED drops it (no HEP policy: allowed). */
			s->flags |= CALI_ST_SUPPRESS_CT_STATE;
			s->ct_result.rc = CALI_CT_NEW;
			break;
		}
		deny_reason(ctx, CALI_REASON_DROPPED_BY_POLICY);
		return forward_or_drop(ctx);
	case CALI_CT_INVALID:
		/* Tracked, but this endpoint's policy never approved its leg. */
		deny_reason(ctx, CALI_REASON_DROPPED_BY_POLICY);
		return forward_or_drop(ctx);
	default:
		if (is_tcp_syn(s)) {
			/* Force policy on every SYN, even on a tracked flow: the flow may
			 * have been approved on behalf of a different destination. */
			CALI_DEBUG("SYN on a tracked flow: forcing policy");
			goto run_policy;
		}
		return skip_policy(ctx);
	}

	if (CALI_F_TO_HOST && cali_rt_flags_local_host(cali_rt_lookup_flags(&s->ip_dst)))
		s->flags |= CALI_ST_DEST_IS_HOST;
	if (CALI_F_FROM_HOST && cali_rt_flags_local_host(cali_rt_lookup_flags(&s->ip_src)))
		s->flags |= CALI_ST_SRC_IS_HOST;

	if (CALI_F_FROM_HEP && !hep_rpf_ok(ctx)) {
		/* Before the failsafes: a spoofed source gets no failsafe either. */
		deny_reason(ctx, CALI_REASON_UNAUTH_SOURCE);
		return forward_or_drop(ctx);
	}

	if (CALI_F_TO_WEP && !skb_seen(ctx->skb) && (s->flags & CALI_ST_SRC_IS_HOST)) {
		/* Host to local workload traffic is always allowed. */
		CALI_DEBUG("from the local host: skip policy");
		return skip_policy(ctx);
	}

	if (CALI_F_FROM_HEP && (s->flags & CALI_ST_DEST_IS_HOST) &&
	    is_failsafe_in(s->ip_proto, s->post_nat_dport, s->ip_src)) {
		COUNTER_INC(ctx, CALI_REASON_ACCEPTED_BY_FAILSAFE);
		return skip_policy(ctx);
	}
	if (CALI_F_TO_HEP && (s->flags & CALI_ST_SRC_IS_HOST) &&
	    is_failsafe_out(s->ip_proto, s->post_nat_dport, s->post_nat_ip_dst)) {
		COUNTER_INC(ctx, CALI_REASON_ACCEPTED_BY_FAILSAFE);
		return skip_policy(ctx);
	}

	if (CALI_F_TO_HOST) {
		/* Service-loop prevention: an address in an advertised service CIDR
		 * that nothing translated belongs to no one; routed on, it would loop
		 * between this node and its gateway. */
		__u32 bh = cali_rt_lookup_flags(&s->post_nat_ip_dst) &
			   (CALI_RT_BLACKHOLE_DROP | CALI_RT_BLACKHOLE_REJECT);

		if (bh == CALI_RT_BLACKHOLE_REJECT) {
			CALI_DEBUG("destination is a blackhole route: REJECT");
			COUNTER_INC(ctx, CALI_REASON_BLACK_HOLE);
			return icmp_reject(ctx);
		}
		if (bh) {
			CALI_DEBUG("destination is a blackhole route: DROP");
			deny_reason(ctx, CALI_REASON_BLACK_HOLE);
			return forward_or_drop(ctx);
		}
	}

	if (is_nd_or_mld(s))
		return skip_policy(ctx);

run_policy:
	CALI_JUMP_TO_POLICY(ctx);
	/* Only reached when the endpoint's policy slot is empty. */
	if (CALI_F_HEP) {
		CALI_DEBUG("no policy program on a host endpoint: allow");
		return skip_policy(ctx);
	}
	CALI_DEBUG("no policy program on a workload: DROP");
	deny_reason(ctx, CALI_REASON_DROPPED_BY_POLICY);
	return forward_or_drop(ctx);
}

int calico_tc_main(struct __sk_buff *skb)
{
	DECLARE_TC_CTX(_ctx, skb);
	struct cali_tc_ctx *ctx = &_ctx;

	__builtin_memset(ctx->state, 0, sizeof(*ctx->state));
	COUNTER_INC_TOTAL(ctx);
	CALI_DEBUG("new packet ifindex=%d mark=0x%x", skb->ifindex, skb->mark);

	if (CALI_F_FROM_HOST) {
		__u32 m = skb->mark & CALI_SKB_MARK_BYPASS_MASK;

		if (skb->mark == CALI_SKB_MARK_BYPASS || m == CALI_SKB_MARK_BYPASS_FWD) {
			/* Another program approved the whole flow already. */
			COUNTER_INC(ctx, CALI_REASON_BYPASS);
			return TC_ACT_UNSPEC;
		}
	}

	if (CALI_F_FROM_HEP) {
		void *meta = (void *)(long)skb->data_meta;
		void *data = (void *)(long)skb->data;

		if (meta + sizeof(struct cali_metadata) <= data &&
		    (((struct cali_metadata *)meta)->flags & CALI_META_ACCEPTED_BY_XDP)) {
			/* Untracked policy in XDP accepted it; iptables NOTRACKs it. */
			skb->mark = CALI_SKB_MARK_BYPASS_XDP;
			return TC_ACT_UNSPEC;
		}
	}

	if (skb->protocol == bpf_htons(ETH_P_ARP))
		return TC_ACT_UNSPEC;
	if (skb->protocol != bpf_htons(CALI_ETH_P)) {
		/* Other family or unknown ethertype: a host interface is not ours to
		 * police; a workload gets nothing we cannot police. */
		if (CALI_F_HEP)
			return TC_ACT_UNSPEC;
		CALI_DEBUG("unexpected ethertype 0x%x on a workload: DROP", bpf_ntohs(skb->protocol));
		return TC_ACT_SHOT;
	}

	if (parse_ip(ctx) != PARSING_OK || parse_l4(ctx) != PARSING_OK)
		return forward_or_drop(ctx);

	return pre_policy_processing(ctx);
}

/* Outgoing NAT (an IP pool with natOutgoing): a workload's flow to a destination
 * outside every pool (and, with NATOutgoingExclusions=IPPoolsAndHostIPs, not a
 * host) leaves through the host stack with the NAT_OUT mark, which iptables/nft
 * MASQUERADE (cali-nat-outgoing); the flag lives in the conntrack entry so the
 * whole flow keeps taking that path (Linux conntrack translates the rest). */
static CALI_BPF_INLINE bool wants_nat_outgoing(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;

	if (ct_result_rc(s->ct_result.rc) != CALI_CT_NEW)
		return s->ct_result.flags & CALI_CT_FLAG_NAT_OUT;
	if (!(cali_rt_lookup_flags(&s->ip_src) & CALI_RT_NAT_OUT))
		return false;

	__u32 dst = cali_rt_lookup_flags(&s->ip_dst);

	if (dst & CALI_RT_IN_POOL)
		return false;
	if ((GLOBAL_FLAGS(ctx) & CALI_GLOBALS_NATOUTGOING_EXCLUDE_HOSTS) && (dst & CALI_RT_HOST))
		return false;
	return true;
}

/* Egress DSCP (an endpoint's QoS DSCP policy): the packets a workload sends --
 * or, on a host endpoint, the host itself sends -- on a flow to a destination
 * outside the cluster (in no IP pool, not a workload, not this host) leave with
 * the endpoint's DSCP, as the *tables modes' mangle cali-egress-dscp sets it.
 * The decision is the flow's: made on its first packet and kept in the
 * conntrack entry (SET_DSCP). */
static CALI_BPF_INLINE bool wants_dscp(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;

	if (EGRESS_DSCP(ctx) < 0)
		return false;
	if (CALI_F_TO_HEP && !cali_rt_flags_local_host(cali_rt_lookup_flags(&s->ip_src)))
		return false;	/* forwarded traffic keeps what its own endpoint set */
	if (ct_result_rc(s->ct_result.rc) != CALI_CT_NEW)
		return s->ct_result.flags & CALI_CT_FLAG_SET_DSCP;

	__u32 dst = cali_rt_lookup_flags(&s->ip_dst);

	return !(dst & (CALI_RT_IN_POOL | CALI_RT_WORKLOAD)) && !cali_rt_flags_local_host(dst);
}

/* Rewrite the DSCP bits of the IP header, keeping the ECN bits. */
#ifndef IPVER6
static CALI_BPF_INLINE int ip_set_dscp(struct __sk_buff *skb, __u8 dscp)
{
	__u8 word[2];	/* version/ihl and TOS: the 16-bit word the header checksum covers */

	if (bpf_skb_load_bytes(skb, CALI_ETH_HLEN, word, 2))
		return -1;
	__u8 tos = (word[1] & 0x03) | (__u8)(dscp << 2);

	if (tos == word[1])
		return 0;
	__be16 old = bpf_htons(((__u16)word[0] << 8) | word[1]);
	__be16 new = bpf_htons(((__u16)word[0] << 8) | tos);

	if (bpf_l3_csum_replace(skb, CALI_ETH_HLEN + __builtin_offsetof(struct iphdr, check), old, new, 2))
		return -1;
	return bpf_skb_store_bytes(skb, CALI_ETH_HLEN + 1, &tos, 1, 0);
}
#else
static CALI_BPF_INLINE int ip_set_dscp(struct __sk_buff *skb, __u8 dscp)
{
	__u8 word[2];	/* version(4) | traffic class(8) | flow label's top 4 bits */

	if (bpf_skb_load_bytes(skb, CALI_ETH_HLEN, word, 2))
		return -1;
	__u8 tc = ((word[0] & 0x0f) << 4) | (word[1] >> 4);
	__u8 ntc = (tc & 0x03) | (__u8)(dscp << 2);

	if (ntc == tc)
		return 0;
	word[0] = (word[0] & 0xf0) | (ntc >> 4);
	word[1] = (word[1] & 0x0f) | (__u8)(ntc << 4);
	return bpf_skb_store_bytes(skb, CALI_ETH_HLEN, word, 2, 0);
}
#endif

int calico_tc_skb_accepted_entrypoint(struct __sk_buff *skb)
{
	DECLARE_TC_CTX(_ctx, skb);
	struct cali_tc_ctx *ctx = &_ctx;
	struct cali_tc_state *s = ctx->state;

	CALI_DEBUG("ALLOWED pol_rc=%d flags=0x%x", s->pol_rc, (__u32)s->flags);
	if (!(s->flags & CALI_ST_SKIP_POLICY))
		COUNTER_INC(ctx, CALI_REASON_ACCEPTED_BY_POLICY);

	if (CALI_F_TO_HEP && (s->flags & CALI_ST_SUPPRESS_CT_STATE) && !(s->flags & CALI_ST_SKIP_POLICY)) {
		/* A mid-flow packet without conntrack leaving through a HEP that has
		 * policy: drop, as iptables' invalid-state check would. */
		deny_reason(ctx, CALI_REASON_DROPPED_BY_POLICY);
		return forward_or_drop(ctx);
	}

	if (CALI_F_FROM_WEP && wants_nat_outgoing(ctx)) {
		CALI_DEBUG("NAT outgoing: via the host stack");
		s->flags |= CALI_ST_NAT_OUTGOING;
	}

	if ((CALI_F_FROM_WEP || CALI_F_TO_HEP) && wants_dscp(ctx)) {
		CALI_DEBUG("egress DSCP %d", EGRESS_DSCP(ctx));
		s->flags |= CALI_ST_SET_DSCP;
		if (ip_set_dscp(skb, (__u8)EGRESS_DSCP(ctx))) {
			deny_reason(ctx, CALI_REASON_CSUM_FAIL);
			return forward_or_drop(ctx);
		}
	}

	if (ct_result_rc(s->ct_result.rc) == CALI_CT_NEW && !(s->flags & CALI_ST_SUPPRESS_CT_STATE)) {
		CALI_JUMP_TO(ctx, PROG_INDEX_NEW_FLOW);
		CALI_DEBUG("tail call to NEW_FLOW failed");
		deny_reason(ctx, CALI_REASON_CT_CREATE_FAILED);
		return forward_or_drop(ctx);
	}
	return forward_or_drop(ctx);
}

int calico_tc_skb_new_flow_entrypoint(struct __sk_buff *skb)
{
	DECLARE_TC_CTX(_ctx, skb);
	struct cali_tc_ctx *ctx = &_ctx;

	if (ctx->state->pol_rc != CALI_POL_ALLOW) {
		/* Default-deny programs reach here with NO_MATCH. */
		CALI_DEBUG("NEW_FLOW without an allow verdict: DROP");
		deny_reason(ctx, CALI_REASON_DROPPED_BY_POLICY);
		return forward_or_drop(ctx);
	}
	if (conntrack_create(ctx)) {
		deny_reason(ctx, CALI_REASON_CT_CREATE_FAILED);
		return forward_or_drop(ctx);
	}
	return forward_or_drop(ctx);
}

int calico_tc_skb_drop(struct __sk_buff *skb)
{
	DECLARE_TC_CTX(_ctx, skb);
	struct cali_tc_ctx *ctx = &_ctx;

	CALI_DEBUG("DROP by policy pol_rc=%d", ctx->state->pol_rc);
	COUNTER_INC(ctx, CALI_REASON_DROPPED_BY_POLICY);
	return TC_ACT_SHOT;
}
