// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Routes map (cali_v4_routes / cali_v6_routes), LPM trie.
//   key:   u32 prefixlen (host order), addr NBO
//   value: u32 flags (enum cali_rt_flags, host order), then either the encap
//          next hop (NBO; remote workloads) or, in the first u32, the ifindex
//          (host order; local workloads).
// Programs always look up a full-length (/32, /128) key.

#ifndef __CALI_ROUTES_TYPES_H__
#define __CALI_ROUTES_TYPES_H__

#include "ip_addr.h"

struct cali_rt_key {
	__u32 prefixlen;
	ipv46_addr_t addr;
};

enum cali_rt_flags {
	CALI_RT_UNKNOWN			= 0x00,
	CALI_RT_IN_POOL			= 0x01,
	CALI_RT_NAT_OUT			= 0x02,
	CALI_RT_WORKLOAD		= 0x04,
	CALI_RT_LOCAL			= 0x08,
	CALI_RT_HOST			= 0x10,
	CALI_RT_SAME_SUBNET		= 0x20,
	CALI_RT_TUNNELED		= 0x40,
	CALI_RT_NO_DSR			= 0x80,
	CALI_RT_BLACKHOLE_DROP		= 0x100,
	CALI_RT_BLACKHOLE_REJECT	= 0x200,
	CALI_RT_VXLAN			= 0x400,
	CALI_RT_SKIP_INGRESS_REDIRECT	= 0x800,
};

struct cali_rt {
	__u32 flags;
	union {
		ipv46_addr_t next_hop;
		__u32 if_index;
	};
};

#ifdef IPVER6
CALI_STATIC_ASSERT(sizeof(struct cali_rt_key) == 20, "rt key v6");
CALI_STATIC_ASSERT(sizeof(struct cali_rt) == 20, "rt value v6");
#else
CALI_STATIC_ASSERT(sizeof(struct cali_rt_key) == 8, "rt key v4");
CALI_STATIC_ASSERT(sizeof(struct cali_rt) == 8, "rt value v4");
#endif

#endif /* __CALI_ROUTES_TYPES_H__ */
