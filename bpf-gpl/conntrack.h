// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Connection tracking: lookup (with leg approval) and creation.
//
// Each entry has two legs, A->B and B->A.  The program that creates an entry
// approves its own leg: a program on the path into the host (from-WEP/from-HEP)
// approves the source's leg, one on the path out (to-WEP/to-HEP) the
// destination's.  A later program that sees the packet already marked SEEN
// approves its leg on the existing entry.  When both legs are approved the flow
// is ESTABLISHED_BYPASS (+CONFIRMED).
//
// Only NORMAL (non-NAT) entries are created by felixpy's programs.

#ifndef __CALI_CONNTRACK_H__
#define __CALI_CONNTRACK_H__

#include "tc.h"
#include "conntrack_types.h"

#ifdef IPVER6
CALI_MAP(cali_ct, cali_v6_ct4, "lru_hash", struct calico_ct_key, struct calico_ct_value, 512000, 0);
#else
CALI_MAP(cali_ct, cali_v4_ct4, "lru_hash", struct calico_ct_key, struct calico_ct_value, 512000, 0);
#endif

static CALI_BPF_INLINE bool src_lt_dest(ipv46_addr_t *src, ipv46_addr_t *dst,
					__u16 sport, __u16 dport)
{
	int c = ip_cmp(src, dst);

	if (c != 0)
		return c < 0;
	return sport < dport;
}

static CALI_BPF_INLINE void fill_ct_key(struct calico_ct_key *k, bool sltd, __u8 proto,
					ipv46_addr_t *ipa, ipv46_addr_t *ipb, __u16 pta, __u16 ptb)
{
	k->protocol = proto;
	if (sltd) {
		k->addr_a = *ipa;
		k->addr_b = *ipb;
		k->port_a = pta;
		k->port_b = ptb;
	} else {
		k->addr_a = *ipb;
		k->addr_b = *ipa;
		k->port_a = ptb;
		k->port_b = pta;
	}
}

#ifdef IPVER6
#define CALI_ICMP_ECHO_REQUEST	128
#define CALI_ICMP_ECHO_REPLY	129
#else
#define CALI_ICMP_ECHO_REQUEST	8
#define CALI_ICMP_ECHO_REPLY	0
#endif

static CALI_BPF_INLINE bool icmp_is_echo(struct cali_tc_state *s)
{
	return s->ip_proto == IPPROTO_ICMP_46 &&
	       (s->icmp_type == CALI_ICMP_ECHO_REQUEST || s->icmp_type == CALI_ICMP_ECHO_REPLY);
}

/* The key's "ports": TCP/UDP ports; for an ICMP echo request/reply the echo
 * identifier on both sides (Linux's tuple keys echoes by it too), so every ping
 * is its own flow; other ICMP types have none. */
static CALI_BPF_INLINE void ct_key_ports(struct cali_tc_state *s, __u16 *sport, __u16 *dport)
{
	if (s->ip_proto == IPPROTO_ICMP_46) {
		__u16 id = icmp_is_echo(s) ? s->icmp_id : 0;

		*sport = id;
		*dport = id;
		return;
	}
	*sport = s->sport;
	*dport = s->dport;
}

/* "A TCP SYN on a flow we already track": the one spelling of the question,
 * shared by the force-policy path and the redirect-peer / bypass gates. */
static CALI_BPF_INLINE bool is_tcp_syn(struct cali_tc_state *s)
{
	return s->ip_proto == IPPROTO_TCP && ct_result_is_syn(s->ct_result.rc);
}

static CALI_BPF_INLINE bool tcp_recycled(bool syn, struct calico_ct_value *v)
{
	struct calico_ct_leg *a = &v->a_to_b, *b = &v->b_to_a;

	return syn && (a->fin_seen || a->rst_seen) && (b->fin_seen || b->rst_seen);
}

static CALI_BPF_INLINE void ct_tcp_update(struct cali_tc_state *s, struct calico_ct_leg *src_to_dst,
					  struct calico_ct_value *v, __u64 now)
{
	__u8 f = s->tcp_flags;

	if (f & CALI_TCP_RST) {
		src_to_dst->rst_seen = 1;
		v->rst_seen = now;
	}
	if (f & CALI_TCP_FIN)
		src_to_dst->fin_seen = 1;
	if (f & CALI_TCP_SYN)
		src_to_dst->syn_seen = 1;
	if (f & CALI_TCP_ACK)
		src_to_dst->ack_seen = 1;
}

/* Look the packet's flow up and record the result in state->ct_result. */
static CALI_BPF_INLINE void calico_ct_lookup(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;
	struct calico_ct_result *res = &s->ct_result;
	bool tcp = s->ip_proto == IPPROTO_TCP;
	bool syn = tcp && (s->tcp_flags & CALI_TCP_SYN) && !(s->tcp_flags & CALI_TCP_ACK);
	__u16 sport, dport;
	struct calico_ct_key k = {};

	ct_key_ports(s, &sport, &dport);
	bool sltd = src_lt_dest(&s->ip_src, &s->ip_dst, sport, dport);

	__builtin_memset(res, 0, sizeof(*res));
	fill_ct_key(&k, sltd, s->ip_proto, &s->ip_src, &s->ip_dst, sport, dport);

	struct calico_ct_value *v = cali_ct.lookup(&k);
	if (!v) {
		if (syn)
			goto out_new;
		if (CALI_F_FROM_HOST && tcp) {
			/* Mid-flow TCP leaving the host: established in Linux conntrack? */
			if ((ctx->skb->mark & CALI_SKB_MARK_CT_ESTABLISHED_MASK) ==
			    CALI_SKB_MARK_CT_ESTABLISHED) {
				res->rc = CALI_CT_ESTABLISHED;
				return;
			}
			res->rc = CALI_CT_MID_FLOW_MISS;
			return;
		}
		if (CALI_F_TO_HOST && tcp) {
			res->rc = CALI_CT_MID_FLOW_MISS;
			return;
		}
		goto out_new;
	}

	if (v->type != CALI_CT_TYPE_NORMAL) {
		/* NAT entries are not produced by felixpy's programs. */
		goto out_new;
	}

	__u64 now = bpf_ktime_get_ns();

	if (tcp_recycled(syn, v)) {
		CALI_DEBUG("CT: SYN recycles a closed entry");
		cali_ct.delete(&k);
		goto out_new;
	}
	struct calico_ct_leg *src_to_dst, *dst_to_src;

	if (sltd) {
		src_to_dst = &v->a_to_b;
		dst_to_src = &v->b_to_a;
	} else {
		src_to_dst = &v->b_to_a;
		dst_to_src = &v->a_to_b;
	}

	if (icmp_is_echo(s) &&
	    (s->icmp_type == CALI_ICMP_ECHO_REQUEST) != (bool)src_to_dst->opener) {
		/* A request continues only the flow it opened; a reply only travels
		 * back.  Anything else (the host pinged a workload and the workload
		 * now pings the host with the same identifier) is a new flow for
		 * policy, as in Linux conntrack, whose reply tuple expects a reply. */
		CALI_DEBUG("CT: ICMP echo against the entry's direction: NEW");
		goto out_new;
	}

	v->last_seen = now;
	res->flags = ct_value_get_flags(v);
	if (src_to_dst->opener)
		res->ifindex_created = src_to_dst->ifindex;
	else if (dst_to_src->opener)
		res->ifindex_created = dst_to_src->ifindex;

	__s16 rc;

	if (v->a_to_b.approved && v->b_to_a.approved)
		rc = CALI_CT_ESTABLISHED_BYPASS | CT_RES_CONFIRMED;
	else
		rc = CALI_CT_ESTABLISHED;

	if (CALI_F_TO_HOST) {
		/* The packet's source is our endpoint: its leg must be approved. */
		if (!src_to_dst->approved) {
			CALI_DEBUG("CT: hit but not approved by this endpoint (to host)");
			rc = tcp ? CALI_CT_INVALID : CALI_CT_NEW;
		}
	} else {
		/* The packet's destination is our endpoint. */
		if (!dst_to_src->approved) {
			CALI_DEBUG("CT: hit but not approved by this endpoint (from host)");
			rc = (tcp && !syn) ? CALI_CT_INVALID : CALI_CT_NEW;
		}
	}

	if (tcp)
		ct_tcp_update(s, src_to_dst, v, now);

	if (CALI_F_TO_HOST) {
		if (src_to_dst->ifindex != ctx->skb->ifindex)
			src_to_dst->ifindex = ctx->skb->ifindex;
		res->ifindex_fwd = dst_to_src->ifindex;
		if (dst_to_src->workload)
			rc |= CT_RES_TO_WORKLOAD;
	}
	if (!skb_seen(ctx->skb)) {
		src_to_dst->packets++;
		src_to_dst->bytes += ctx->skb->len;
	}
	if (syn)
		rc |= CT_RES_SYN;
	res->rc = rc;
	CALI_DEBUG("CT: hit rc=0x%x", rc);
	return;

out_new:
	res->rc = CALI_CT_NEW;
	CALI_DEBUG("CT: NEW");
}

/* A program towards the host approves the packet source's leg, one away from
 * the host the destination's. */
static CALI_BPF_INLINE void ct_approve_our_leg(struct calico_ct_value *v, bool sltd)
{
	struct calico_ct_leg *leg = (sltd == (bool)CALI_F_TO_HOST) ? &v->a_to_b : &v->b_to_a;

	leg->approved = 1;
	leg->workload = CALI_F_WEP ? 1 : 0;
}

/* Create the entry for an allowed new flow, or approve our leg of the entry
 * another program created (packet marked SEEN).  Returns 0 or -errno. */
static CALI_BPF_INLINE int conntrack_create(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;
	__u16 sport, dport;
	bool syn = s->ip_proto == IPPROTO_TCP && (s->tcp_flags & CALI_TCP_SYN);
	struct calico_ct_key k = {};

	ct_key_ports(s, &sport, &dport);
	bool sltd = src_lt_dest(&s->ip_src, &s->ip_dst, sport, dport);

	if (s->flags & CALI_ST_SUPPRESS_CT_STATE)
		return 0;

	fill_ct_key(&k, sltd, s->ip_proto, &s->ip_src, &s->ip_dst, sport, dport);

	if (skb_seen(ctx->skb)) {
		struct calico_ct_value *ev = cali_ct.lookup(&k);

		if (ev) {
			ct_approve_our_leg(ev, sltd);
			CALI_DEBUG("CT: approved our leg of an existing entry");
			return 0;
		}
		CALI_DEBUG("CT: SEEN packet but no entry; creating");
	}

	struct calico_ct_value v = {};

	v.last_seen = bpf_ktime_get_ns();
	v.type = CALI_CT_TYPE_NORMAL;

	struct calico_ct_leg *src_to_dst, *dst_to_src;

	if (sltd) {
		src_to_dst = &v.a_to_b;
		dst_to_src = &v.b_to_a;
	} else {
		src_to_dst = &v.b_to_a;
		dst_to_src = &v.a_to_b;
		ct_value_set_flags(&v, CALI_CT_FLAG_BA);
	}
	if (s->flags & CALI_ST_NAT_OUTGOING)
		ct_value_set_flags(&v, CALI_CT_FLAG_NAT_OUT);
	if (s->flags & CALI_ST_SET_DSCP)
		ct_value_set_flags(&v, CALI_CT_FLAG_SET_DSCP);
	/* The host stack took this flow in for a local address and handed it to
	 * this workload (its DNAT: a node port of the host's own): the replies must
	 * go back through the host stack to be translated back, never straight
	 * out by FIB (raw PREROUTING marked it SKIP_FIB). */
	if (CALI_F_TO_WEP && (ctx->skb->mark & CALI_SKB_MARK_BYPASS_MASK) == CALI_SKB_MARK_SKIP_FIB)
		ct_value_set_flags(&v, CALI_CT_FLAG_SKIP_FIB);
	src_to_dst->syn_seen = syn;
	src_to_dst->opener = 1;
	src_to_dst->packets = 1;
	src_to_dst->bytes = ctx->skb->len;
	src_to_dst->ifindex = CALI_F_TO_HOST ? ctx->skb->ifindex : CT_INVALID_IFINDEX;
	dst_to_src->ifindex = CT_INVALID_IFINDEX;

	if (CALI_F_TO_HOST) {
		src_to_dst->approved = 1;
		src_to_dst->workload = CALI_F_WEP ? 1 : 0;
	} else {
		dst_to_src->approved = 1;
		dst_to_src->workload = CALI_F_WEP ? 1 : 0;
	}

	int err = cali_ct.insert(&k, &v);

	if (err == -17 /* EEXIST */) {
		/* Created by another program meanwhile (or the SEEN mark did not
		 * survive the way here): never overwrite it, approve our leg. */
		struct calico_ct_value *ev = cali_ct.lookup(&k);

		if (ev) {
			ct_approve_our_leg(ev, sltd);
			return 0;
		}
	}
	CALI_DEBUG("CT: create err=%d", err);
	return err;
}

#endif /* __CALI_CONNTRACK_H__ */
