// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// struct cali_tc_state: the per-packet state passed between the programs of one
// tail-call chain through slot 0 of the per-CPU cali_state map.  The offsets up
// to `flags` are a contract with the generated policy programs
// (felixpy/bpf/polprog.py) and match Felix's.  Byte order: addresses NBO,
// ports host order.

#ifndef __CALI_TYPES_H__
#define __CALI_TYPES_H__

#include "bpf.h"
#include "ip_addr.h"
#include "conntrack_types.h"
#include "globals_types.h"

#define MAX_RULE_IDS 32

struct cali_tc_state {
	__u32 eventhdr_type;		/* 0 */
	__u32 eventhdr_len;		/* 4 */
	DECLARE_IP_ADDR(ip_src);	/* 8 */
	DECLARE_IP_ADDR(ip_dst);	/* 24 */
	DECLARE_IP_ADDR(pre_nat_ip_dst);	/* 40 */
	DECLARE_IP_ADDR(post_nat_ip_dst);	/* 56 */
	DECLARE_IP_ADDR(tun_ip);	/* 72 */
	__u16 ihl;			/* 88 IP header length incl. v6 extension headers */
	__u16 icmp_id;			/* 90 ICMP echo identifier, host order (felixpy; Felix: unused) */
	__s32 pol_rc;			/* 92 enum calico_policy_result */
	__u16 sport;			/* 96 */
	union {
		__u16 dport;		/* 98 */
		struct {
			__u8 icmp_type;	/* 98 */
			__u8 icmp_code;	/* 99 */
		};
	};
	__u16 pre_nat_dport;		/* 100 */
	__u16 post_nat_dport;		/* 102 */
	__u8 ip_proto;			/* 104 */
	__u8 tcp_flags;			/* 105 TCP flags byte (felixpy; Felix: padding) */
	__u16 ip_size;			/* 106 */
	__u32 rules_hit;		/* 108 */
	__u64 rule_ids[MAX_RULE_IDS];	/* 112 */
	__u64 flags;			/* 368 enum cali_state_flags */
	struct calico_ct_result ct_result;	/* 376 */
	__u32 l4_off;			/* offset of the L4 header from the packet start */
	__u32 __pad_end;
};

CALI_STATIC_ASSERT(__builtin_offsetof(struct cali_tc_state, ip_src) == 8, "state.ip_src");
CALI_STATIC_ASSERT(__builtin_offsetof(struct cali_tc_state, post_nat_ip_dst) == 56, "state.post_nat");
CALI_STATIC_ASSERT(__builtin_offsetof(struct cali_tc_state, pol_rc) == 92, "state.pol_rc");
CALI_STATIC_ASSERT(__builtin_offsetof(struct cali_tc_state, dport) == 98, "state.dport");
CALI_STATIC_ASSERT(__builtin_offsetof(struct cali_tc_state, ip_proto) == 104, "state.ip_proto");
CALI_STATIC_ASSERT(__builtin_offsetof(struct cali_tc_state, flags) == 368, "state.flags");
CALI_STATIC_ASSERT(__builtin_offsetof(struct cali_tc_state, ct_result) == 376, "state.ct_result");

/* Slot 1 of cali_state: the selected half of the attach-point globals followed
 * by scratch space (the FIB lookup parameters). */
struct cali_tc_globals {
	struct cali_tc_global_data data;	/* 0 */
	__u8 __pad[4];				/* 276 */
	struct bpf_fib_lookup fib;		/* 280 */
};

/* Value type of cali_state: a 512-byte blob viewed as cali_tc_state (slot 0)
 * or cali_tc_globals / cali_xdp_globals (slot 1). */
struct cali_state_blob {
	__u8 raw[512];
};

CALI_STATIC_ASSERT(sizeof(struct cali_tc_state) <= 512, "state fits the blob");
CALI_STATIC_ASSERT(sizeof(struct cali_tc_globals) <= 512, "globals fit the blob");

enum cali_state_flags {
	CALI_ST_NAT_OUTGOING		= 0x01,
	CALI_ST_SKIP_FIB		= 0x02,
	CALI_ST_DEST_IS_HOST		= 0x04,
	CALI_ST_SRC_IS_HOST		= 0x08,
	CALI_ST_SUPPRESS_CT_STATE	= 0x10,
	CALI_ST_SKIP_POLICY		= 0x20,
	CALI_ST_SET_DSCP		= 0x40,
	CALI_ST_LOG_PACKET		= 0x400,
};

/* TCP flag bits as in byte 13 of the TCP header. */
#define CALI_TCP_FIN	0x01
#define CALI_TCP_SYN	0x02
#define CALI_TCP_RST	0x04
#define CALI_TCP_ACK	0x10

#ifdef IPVER6
#define CALI_ETH_P	ETH_P_IPV6
#define IPPROTO_ICMP_46	IPPROTO_ICMPV6
#else
#define CALI_ETH_P	ETH_P_IP
#define IPPROTO_ICMP_46	IPPROTO_ICMP
#endif

#endif /* __CALI_TYPES_H__ */
