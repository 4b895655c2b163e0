// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Packet parsing into cali_tc_state.  Headers are read with
// bpf_skb_load_bytes(), which copes with non-linear skbs and keeps the verifier
// free of packet-pointer bookkeeping.  Only Ethernet (L2) devices are handled:
// the IP header is at offset 14.

#ifndef __CALI_PARSING_H__
#define __CALI_PARSING_H__

#include "tc.h"
#include "reasons.h"

enum {
	PARSING_OK = 0,
	PARSING_ALLOW_WITHOUT_ENFORCING_POLICY = 1,
	PARSING_ERROR = -1,	/* ctx->reason says why */
};

#define CALI_ETH_HLEN 14

#ifdef IPVER6
#include "parsing6.h"
#else
#include "parsing4.h"
#endif

/* Fill sport/dport (or ICMP type/code) and the TCP flags from the L4 header. */
static CALI_BPF_INLINE int parse_l4(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;
	__u32 off = s->l4_off;

	switch (s->ip_proto) {
	case IPPROTO_TCP: {
		struct tcphdr tcp;

		if (bpf_skb_load_bytes(ctx->skb, off, &tcp, sizeof(tcp))) {
			deny_reason(ctx, CALI_REASON_SHORT);
			return PARSING_ERROR;
		}
		if (tcp.doff < 5) {
			deny_reason(ctx, CALI_REASON_IP_MALFORMED);
			return PARSING_ERROR;
		}
		s->sport = bpf_ntohs(tcp.source);
		s->dport = bpf_ntohs(tcp.dest);
		s->tcp_flags = ((__u8 *)&tcp)[13];
		break;
	}
	case IPPROTO_UDP: {
		struct udphdr udp;

		if (bpf_skb_load_bytes(ctx->skb, off, &udp, sizeof(udp))) {
			deny_reason(ctx, CALI_REASON_SHORT);
			return PARSING_ERROR;
		}
		s->sport = bpf_ntohs(udp.source);
		s->dport = bpf_ntohs(udp.dest);
		break;
	}
	case IPPROTO_ICMP_46: {
		__u8 tc[8];

		/* An ICMP header is 8 bytes for every type we track. */
		if (bpf_skb_load_bytes(ctx->skb, off, tc, sizeof(tc))) {
			deny_reason(ctx, CALI_REASON_SHORT);
			return PARSING_ERROR;
		}
		s->sport = 0;
		s->icmp_type = tc[0];
		s->icmp_code = tc[1];
		/* Echo request/reply: the identifier tells the flows apart (conntrack). */
		s->icmp_id = ((__u16)tc[4] << 8) | tc[5];
		break;
	}
	default:
		s->sport = 0;
		s->dport = 0;
	}
	s->pre_nat_dport = s->dport;
	s->post_nat_dport = s->dport;
	return PARSING_OK;
}

#endif /* __CALI_PARSING_H__ */
