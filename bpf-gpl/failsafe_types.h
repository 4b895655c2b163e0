// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Failsafe ports (cali_v4_fsafes2 / cali_v6_fsafes2), LPM trie.
//   prefixlen u32 host order = 32 (port+proto+flags) + CIDR length
//   port      u16 host order
//   ip_proto  u8
//   flags     u8  CALI_FSAFE_OUT for outbound entries
//   addr      NBO (remote peer: source for inbound, destination for outbound)

#ifndef __CALI_FAILSAFE_TYPES_H__
#define __CALI_FAILSAFE_TYPES_H__

#include "ip_addr.h"

struct failsafe_key {
	__u32 prefixlen;
	__u16 port;
	__u8 ip_proto;
	__u8 flags;
	ipv46_addr_t addr;
};

struct failsafe_val {
	__u32 unused;
};

#define CALI_FSAFE_OUT 1

#ifdef IPVER6
CALI_STATIC_ASSERT(sizeof(struct failsafe_key) == 24, "failsafe key v6");
#else
CALI_STATIC_ASSERT(sizeof(struct failsafe_key) == 12, "failsafe key v4");
#endif

#endif /* __CALI_FAILSAFE_TYPES_H__ */
