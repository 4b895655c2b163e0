// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Conntrack map key/value (cali_v4_ct4 / cali_v6_ct4), layout identical to
// Felix's.  Byte order: addresses NBO, ports and every other field host order.
// Key ordering: (src, sport) is the A side iff src < dst by raw 32-bit word
// compare (v6: words a, b, c, d in turn), ties broken by sport < dport.

#ifndef __CALI_CONNTRACK_TYPES_H__
#define __CALI_CONNTRACK_TYPES_H__

#include "ip_addr.h"

struct calico_ct_key {
	__u32 protocol;
	ipv46_addr_t addr_a;		/* NBO */
	ipv46_addr_t addr_b;		/* NBO */
	__u16 port_a, port_b;		/* host order */
};

enum cali_ct_type {
	CALI_CT_TYPE_NORMAL	= 0x00,
	CALI_CT_TYPE_NAT_FWD	= 0x01,
	CALI_CT_TYPE_NAT_REV	= 0x02,
};

#define CALI_CT_FLAG_NAT_OUT		0x01
#define CALI_CT_FLAG_DSR_FWD		0x02
#define CALI_CT_FLAG_NP_FWD		0x04
#define CALI_CT_FLAG_SKIP_FIB		0x08
#define CALI_CT_FLAG_EXT_LOCAL		0x40
#define CALI_CT_FLAG_VIA_NAT_IF		0x80
#define CALI_CT_FLAG_BA			0x100
#define CALI_CT_FLAG_SKIP_REDIR_PEER	0x4000
#define CALI_CT_FLAG_SET_DSCP		0x8000

struct calico_ct_leg {
	__u64 bytes;
	__u32 packets;
	__u32 seqno;			/* NBO, as in the TCP header */
	__u32 syn_seen:1;
	__u32 ack_seen:1;
	__u32 fin_seen:1;
	__u32 rst_seen:1;
	__u32 approved:1;
	__u32 opener:1;
	__u32 workload:1;
	__u32 ifindex;			/* ingress ifindex of this leg, 0 = unknown/from host */
};					/* 24 */

#define CT_INVALID_IFINDEX 0

struct calico_ct_value {
	__u64 rst_seen;			/* 0  ktime of last RST */
	__u64 last_seen;		/* 8  ktime ns */
	__u8 type;			/* 16 enum cali_ct_type */
	__u8 flags;			/* 17 flags bits 0-7 */
	__u8 flags3;			/* 18 flags bits 16-23 */
	__u8 flags4;			/* 19 flags bits 24-31 */
	__u8 pad0[3];			/* 20 */
	__u8 flags2;			/* 23 flags bits 8-15 */
	union {
		struct {
			struct calico_ct_leg a_to_b;	/* 24 */
			struct calico_ct_leg b_to_a;	/* 48 */
			ipv46_addr_t tun_ip;		/* 72 */
			ipv46_addr_t orig_ip;		/* v4 76 / v6 88 */
			__u16 orig_port;
			__u16 orig_sport;
			ipv46_addr_t orig_sip;
		};
		struct {
			struct calico_ct_key nat_rev_key;	/* 24 */
			__u16 nat_sport;
#ifdef IPVER6
			__u8 pad2[60];
#else
			__u8 pad2[46];
#endif
		};
	};
};

#ifdef IPVER6
CALI_STATIC_ASSERT(sizeof(struct calico_ct_key) == 40, "ct key v6");
CALI_STATIC_ASSERT(sizeof(struct calico_ct_value) == 128, "ct value v6");
#else
CALI_STATIC_ASSERT(sizeof(struct calico_ct_key) == 16, "ct key v4");
CALI_STATIC_ASSERT(sizeof(struct calico_ct_value) == 88, "ct value v4");
#endif

#define ct_value_set_flags(v, f) do {			\
	(v)->flags |= ((f) & 0xff);			\
	(v)->flags2 |= (((f) >> 8) & 0xff);		\
	(v)->flags3 |= (((f) >> 16) & 0xff);		\
	(v)->flags4 |= (((f) >> 24) & 0xff);		\
} while (0)

#define ct_value_get_flags(v) \
	((__u32)(v)->flags | ((__u32)(v)->flags2 << 8) | ((__u32)(v)->flags3 << 16) | \
	 ((__u32)(v)->flags4 << 24))

enum calico_ct_result_type {
	CALI_CT_NEW			= 0,
	CALI_CT_MID_FLOW_MISS		= 1,
	CALI_CT_ESTABLISHED		= 2,
	CALI_CT_ESTABLISHED_BYPASS	= 3,
	CALI_CT_ESTABLISHED_SNAT	= 4,
	CALI_CT_ESTABLISHED_DNAT	= 5,
	CALI_CT_INVALID			= 6,
	CALI_CT_MAGLEV_MID_FLOW_MISS	= 7,
};

#define CT_RES_RELATED		0x100
#define CT_RES_RPF_FAILED	0x200
#define CT_RES_TUN_SRC_CHANGED	0x400
#define CT_RES_SYN		0x1000
#define CT_RES_CONFIRMED	0x2000
#define CT_RES_TO_WORKLOAD	0x4000

#define ct_result_rc(rc)		((rc) & 0xff)
#define ct_result_set_flag(val, f)	((val) |= (f))
#define ct_result_is_syn(rc)		((rc) & CT_RES_SYN)
#define ct_result_is_confirmed(rc)	((rc) & CT_RES_CONFIRMED)

struct calico_ct_result {
	__s16 rc;			/* low byte enum calico_ct_result_type, high bits CT_RES_* */
	__u16 pad;
	__u32 flags;			/* CALI_CT_FLAG_* of the entry */
	ipv46_addr_t nat_ip;
	ipv46_addr_t nat_sip;
	__u16 nat_port;
	__u16 nat_sport;
	ipv46_addr_t tun_ip;
	__u32 ifindex_fwd;		/* ifindex the other leg arrived on, 0 = unknown */
	__u32 ifindex_created;
};

#ifdef IPVER6
CALI_STATIC_ASSERT(sizeof(struct calico_ct_result) == 68, "ct result v6");
#else
CALI_STATIC_ASSERT(sizeof(struct calico_ct_result) == 32, "ct result v4");
#endif

#endif /* __CALI_CONNTRACK_TYPES_H__ */
