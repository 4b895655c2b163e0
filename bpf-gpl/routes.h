// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later

#ifndef __CALI_ROUTES_H__
#define __CALI_ROUTES_H__

#include "bpf.h"
#include "routes_types.h"

#ifdef IPVER6
CALI_MAP(cali_routes, cali_v6_routes, "lpm_trie", struct cali_rt_key, struct cali_rt, 262144,
	 BPF_F_NO_PREALLOC);
#define CALI_RT_FULL_LEN 128
#else
CALI_MAP(cali_routes, cali_v4_routes, "lpm_trie", struct cali_rt_key, struct cali_rt, 262144,
	 BPF_F_NO_PREALLOC);
#define CALI_RT_FULL_LEN 32
#endif

static CALI_BPF_INLINE struct cali_rt *cali_rt_lookup(ipv46_addr_t *addr)
{
	struct cali_rt_key k = {};

	k.prefixlen = CALI_RT_FULL_LEN;
	k.addr = *addr;
	return cali_routes.lookup(&k);
}

static CALI_BPF_INLINE __u32 cali_rt_lookup_flags(ipv46_addr_t *addr)
{
	struct cali_rt *rt = cali_rt_lookup(addr);

	return rt ? rt->flags : CALI_RT_UNKNOWN;
}

#define cali_rt_flags_local_host(t) \
	(((t) & (CALI_RT_LOCAL | CALI_RT_HOST)) == (CALI_RT_LOCAL | CALI_RT_HOST))
#define cali_rt_flags_local_workload(t) \
	(((t) & (CALI_RT_LOCAL | CALI_RT_WORKLOAD)) == (CALI_RT_LOCAL | CALI_RT_WORKLOAD))

#endif /* __CALI_ROUTES_H__ */
