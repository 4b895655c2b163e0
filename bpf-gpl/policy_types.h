// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// IP-set LPM key (cali_v4_ip_sets / cali_v6_ip_sets), packed, Felix's layout:
//   prefixlen  u32  host order (LPM bit count of the data that follows)
//   set_id     u64  BIG-endian, so that one set's members share a prefix
//   addr            NBO
//   port       u16  host order (named-port members; 0 otherwise)
//   protocol   u8
//   pad        u8
// A CIDR member is stored with prefixlen 64 + CIDR length (port/proto ignored);
// a named-port member ("ip,tcp:80") with 64 + addr bits + 16 + 8.  Lookups use
// the full key length (v4 128, v6 224).  Value: u32, always 1.

#ifndef __CALI_POLICY_TYPES_H__
#define __CALI_POLICY_TYPES_H__

#include "ip_addr.h"

struct ip4_set_key {
	__u32 prefixlen;
	__be64 set_id;
	__be32 addr;
	__u16 port;
	__u8 protocol;
	__u8 pad;
} __attribute__((packed));

struct ip6_set_key {
	__u32 prefixlen;
	__be64 set_id;
	ipv6_addr_t addr;
	__u16 port;
	__u8 protocol;
	__u8 pad;
} __attribute__((packed));

CALI_STATIC_ASSERT(sizeof(struct ip4_set_key) == 20, "ip4_set_key");
CALI_STATIC_ASSERT(sizeof(struct ip6_set_key) == 32, "ip6_set_key");

enum calico_policy_result {
	CALI_POL_NO_MATCH		= 0,
	CALI_POL_ALLOW			= 1,
	CALI_POL_DENY			= 2,
	CALI_POL_TAIL_CALL_FAILED	= 10,
};

#endif /* __CALI_POLICY_TYPES_H__ */
