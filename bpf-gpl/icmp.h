// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// A reject: the packet in hand becomes an ICMP (ICMPv6) port-unreachable to its
// sender, sent back out of the interface it arrived on.  Used for blackhole-reject
// routes (ServiceLoopPrevention=Reject), as Felix answers them.
//
// The error quotes the offending packet's IP header and the first 8 bytes after it
// (RFC 792 / RFC 4443 ask for at least that much), the whole basic 20-byte header for
// TCP: a workload's own packets reach us with the checksum left to offload
// (CHECKSUM_PARTIAL), and the kernel will not cut such a packet before the end of its
// L4 checksum field.  Its source is the address the packet was sent to, so the
// sender's stack matches it to the socket that sent it.
// It leaves with the BYPASS mark: the program on the egress hook it is redirected to
// passes it (it answers a packet this program has already judged).

#ifndef __CALI_ICMP_H__
#define __CALI_ICMP_H__

#include "tc.h"

#define CALI_ICMP_QUOTE		8	/* bytes quoted after the offending packet's IP header */
#define CALI_ICMP_QUOTE_TCP	20	/* ... for TCP: its checksum field included */

static CALI_BPF_INLINE __u16 csum_fold(__s64 partial)
{
	__u32 c = (__u32)partial;

	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return (__u16)~c;
}

#ifdef IPVER6
struct cali_icmp_err_hdr {
	struct ipv6hdr ip;
	struct icmp6hdr icmp;
} __attribute__((packed));
#define CALI_ICMP_IP_HLEN	40
#else
struct cali_icmp_err_hdr {
	struct iphdr ip;
	struct icmphdr icmp;
} __attribute__((packed));
#define CALI_ICMP_IP_HLEN	20
#endif

/* quote: a constant once inlined (the helpers' sizes must be known to the verifier). */
static CALI_BPF_INLINE int __icmp_reject(struct cali_tc_ctx *ctx, const __u32 quote)
{
	struct __sk_buff *skb = ctx->skb;
	struct cali_tc_state *s = ctx->state;
	const __u32 orig_len = CALI_ICMP_IP_HLEN + quote;
	struct ethhdr eth;
	__u8 orig[CALI_ICMP_IP_HLEN + CALI_ICMP_QUOTE_TCP];
	struct cali_icmp_err_hdr h = {};
	__s64 sum;

#ifndef IPVER6
	if (s->ihl != CALI_ICMP_IP_HLEN)
		return TC_ACT_SHOT;	/* options: the quote would not be the header the sender sent */
#endif
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) ||
	    bpf_skb_load_bytes(skb, CALI_ETH_HLEN, orig, orig_len))
		return TC_ACT_SHOT;
	/* Keep the header and the quote, then open room for the error's own headers. */
	if (bpf_skb_change_tail(skb, CALI_ETH_HLEN + orig_len, 0) ||
	    bpf_skb_adjust_room(skb, sizeof(h), BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;

#ifdef IPVER6
	h.ip.version = 6;
	h.ip.payload_len = bpf_htons(sizeof(h.icmp) + orig_len);
	h.ip.nexthdr = IPPROTO_ICMPV6;
	h.ip.hop_limit = 64;
	__builtin_memcpy(&h.ip.saddr, &s->ip_dst, 16);
	__builtin_memcpy(&h.ip.daddr, &s->ip_src, 16);
	h.icmp.icmp6_type = 1;	/* destination unreachable */
	h.icmp.icmp6_code = 4;	/* port unreachable */
	/* Pseudo-header: source, destination, upper-layer length, next header. */
	__be32 pseudo[2] = {bpf_htonl(sizeof(h.icmp) + orig_len), bpf_htonl(IPPROTO_ICMPV6)};

	sum = bpf_csum_diff(0, 0, (__be32 *)&h.ip.saddr, 32, 0);
	sum = bpf_csum_diff(0, 0, pseudo, sizeof(pseudo), sum);
	sum = bpf_csum_diff(0, 0, (__be32 *)&h.icmp, sizeof(h.icmp), sum);
	sum = bpf_csum_diff(0, 0, (__be32 *)orig, orig_len, sum);
	h.icmp.icmp6_cksum = csum_fold(sum);
#else
	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.tot_len = bpf_htons(sizeof(h) + orig_len);
	h.ip.ttl = 64;
	h.ip.protocol = IPPROTO_ICMP;
	h.ip.saddr = s->ip_dst;
	h.ip.daddr = s->ip_src;
	h.ip.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&h.ip, sizeof(h.ip), 0));
	h.icmp.type = ICMP_DEST_UNREACH;
	h.icmp.code = ICMP_PORT_UNREACH;
	sum = bpf_csum_diff(0, 0, (__be32 *)&h.icmp, sizeof(h.icmp), 0);
	sum = bpf_csum_diff(0, 0, (__be32 *)orig, orig_len, sum);
	h.icmp.checksum = csum_fold(sum);
#endif

	/* Back where it came from: the Ethernet addresses swap. */
	struct ethhdr back = {.h_proto = eth.h_proto};

	__builtin_memcpy(back.h_dest, eth.h_source, ETH_ALEN);
	__builtin_memcpy(back.h_source, eth.h_dest, ETH_ALEN);
	if (bpf_skb_store_bytes(skb, 0, &back, sizeof(back), 0) ||
	    bpf_skb_store_bytes(skb, CALI_ETH_HLEN, &h, sizeof(h), 0))
		return TC_ACT_SHOT;
	skb->mark = CALI_SKB_MARK_BYPASS;
	CALI_DEBUG("reject: ICMP port unreachable back out of ifindex %d", skb->ifindex);
	return bpf_redirect(skb->ifindex, 0);
}

/* Returns TC_ACT_REDIRECT, or TC_ACT_SHOT when the packet cannot be turned into the
 * error (IPv4 options, too short for the quote, a helper refused): the caller counts
 * it either way, and a failed reject is a drop. */
static CALI_BPF_INLINE int icmp_reject(struct cali_tc_ctx *ctx)
{
	if (ctx->state->ip_proto == IPPROTO_TCP)
		return __icmp_reject(ctx, CALI_ICMP_QUOTE_TCP);
	return __icmp_reject(ctx, CALI_ICMP_QUOTE);
}

#endif /* __CALI_ICMP_H__ */
