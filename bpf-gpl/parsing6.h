// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later

#ifndef __CALI_PARSING6_H__
#define __CALI_PARSING6_H__

#define CALI_V6_MAX_EXT_HDRS 8

#define NEXTHDR_HOP		0
#define NEXTHDR_ROUTING		43
#define NEXTHDR_FRAGMENT	44
#define NEXTHDR_AUTH		51
#define NEXTHDR_NONE		59
#define NEXTHDR_DEST		60

/* Parse the IPv6 header and walk the extension headers to the L4 header.
 * Non-first fragments are dropped; more than CALI_V6_MAX_EXT_HDRS extension
 * headers is treated as malformed. */
static CALI_BPF_INLINE int parse_ip(struct cali_tc_ctx *ctx)
{
	struct cali_tc_state *s = ctx->state;
	struct ipv6hdr ip6;

	if (bpf_skb_load_bytes(ctx->skb, CALI_ETH_HLEN, &ip6, sizeof(ip6))) {
		deny_reason(ctx, CALI_REASON_SHORT);
		return PARSING_ERROR;
	}
	if (ip6.version != 6) {
		deny_reason(ctx, CALI_REASON_IP_MALFORMED);
		return PARSING_ERROR;
	}
	__u32 payload = bpf_ntohs(ip6.payload_len);

	if (ctx->skb->len < CALI_ETH_HLEN + sizeof(ip6) + payload) {
		deny_reason(ctx, CALI_REASON_SHORT);
		return PARSING_ERROR;
	}
	__builtin_memcpy(&s->ip_src, &ip6.saddr, 16);
	__builtin_memcpy(&s->ip_dst, &ip6.daddr, 16);
	s->pre_nat_ip_dst = s->ip_dst;
	s->post_nat_ip_dst = s->ip_dst;
	s->ip_size = sizeof(ip6) + payload;

	__u8 nh = ip6.nexthdr;
	__u32 off = CALI_ETH_HLEN + sizeof(ip6);
	int i;

#pragma unroll
	for (i = 0; i < CALI_V6_MAX_EXT_HDRS; i++) {
		__u8 hdr[8];

		switch (nh) {
		case NEXTHDR_HOP:
		case NEXTHDR_ROUTING:
		case NEXTHDR_DEST:
			if (bpf_skb_load_bytes(ctx->skb, off, hdr, 2))
				goto short_pkt;
			nh = hdr[0];
			off += (hdr[1] + 1) * 8;
			continue;
		case NEXTHDR_AUTH:
			if (bpf_skb_load_bytes(ctx->skb, off, hdr, 2))
				goto short_pkt;
			nh = hdr[0];
			off += (hdr[1] + 2) * 4;
			continue;
		case NEXTHDR_FRAGMENT:
			if (bpf_skb_load_bytes(ctx->skb, off, hdr, 8))
				goto short_pkt;
			/* fragment offset: top 13 bits of bytes 2-3 */
			if (((hdr[2] << 8) | hdr[3]) & 0xfff8) {
				CALI_DEBUG("v6 non-first fragment: unsupported");
				deny_reason(ctx, CALI_REASON_FRAG_UNSUPPORTED);
				return PARSING_ERROR;
			}
			nh = hdr[0];
			off += 8;
			continue;
		default:
			goto done;
		}
	}
	/* Still in extension headers after the limit. */
	deny_reason(ctx, CALI_REASON_IP_MALFORMED);
	return PARSING_ERROR;

done:
	s->ip_proto = nh;
	s->ihl = off - CALI_ETH_HLEN;
	s->l4_off = off;
	return PARSING_OK;

short_pkt:
	deny_reason(ctx, CALI_REASON_SHORT);
	return PARSING_ERROR;
}

#endif /* __CALI_PARSING6_H__ */
