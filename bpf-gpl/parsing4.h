// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later

#ifndef __CALI_PARSING4_H__
#define __CALI_PARSING4_H__

/* Parse and sanity-check the IPv4 header.  IP options are accepted (skipped
 * via ihl); non-first fragments carry no L4 header and are dropped. */
static CALI_BPF_INLINE int parse_ip(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;
	struct iphdr ip;

	if (bpf_skb_load_bytes(ctx->skb, CALI_ETH_HLEN, &ip, sizeof(ip))) {
		deny_reason(ctx, CALI_REASON_SHORT);
		return PARSING_ERROR;
	}
	if (ip.version != 4 || ip.ihl < 5) {
		deny_reason(ctx, CALI_REASON_IP_MALFORMED);
		return PARSING_ERROR;
	}
	__u32 ihl = ip.ihl * 4;
	__u32 tot_len = bpf_ntohs(ip.tot_len);

	if (tot_len < ihl) {
		deny_reason(ctx, CALI_REASON_IP_MALFORMED);
		return PARSING_ERROR;
	}
	if (ctx->skb->len < CALI_ETH_HLEN + tot_len) {
		deny_reason(ctx, CALI_REASON_SHORT);
		return PARSING_ERROR;
	}
	if (ip.frag_off & bpf_htons(0x1fff)) {
		CALI_DEBUG("non-first fragment: unsupported");
		deny_reason(ctx, CALI_REASON_FRAG_UNSUPPORTED);
		return PARSING_ERROR;
	}
	s->ip_src = ip.saddr;
	s->ip_dst = ip.daddr;
	s->pre_nat_ip_dst = ip.daddr;
	s->post_nat_ip_dst = ip.daddr;
	s->ip_proto = ip.protocol;
	s->ip_size = tot_len;
	s->ihl = ihl;
	s->l4_off = CALI_ETH_HLEN + ihl;
	return PARSING_OK;
}

#endif /* __CALI_PARSING4_H__ */
