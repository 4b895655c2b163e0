// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later

#ifndef __CALI_FAILSAFE_H__
#define __CALI_FAILSAFE_H__

#include "bpf.h"
#include "failsafe_types.h"

#ifdef IPVER6
CALI_MAP(cali_fsafes, cali_v6_fsafes2, "lpm_trie", struct failsafe_key, struct failsafe_val, 65536,
	 BPF_F_NO_PREALLOC);
#else
CALI_MAP(cali_fsafes, cali_v4_fsafes2, "lpm_trie", struct failsafe_key, struct failsafe_val, 65536,
	 BPF_F_NO_PREALLOC);
#endif

#define FSAFE_PREFIX_LEN_IN_BITS ((sizeof(struct failsafe_key) - sizeof(__u32)) * 8)

static CALI_BPF_INLINE bool is_failsafe(__u8 ip_proto, __u16 port, ipv46_addr_t ip, __u8 flags)
{
	struct failsafe_key key = {};

	key.prefixlen = FSAFE_PREFIX_LEN_IN_BITS;
	key.ip_proto = ip_proto;
	key.port = port;
	key.flags = flags;
	key.addr = ip;
	return cali_fsafes.lookup(&key) != NULL;
}

#define is_failsafe_in(proto, dport, src)	is_failsafe(proto, dport, src, 0)
#define is_failsafe_out(proto, dport, dst)	is_failsafe(proto, dport, dst, CALI_FSAFE_OUT)

#endif /* __CALI_FAILSAFE_H__ */
