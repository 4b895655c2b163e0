// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// The IP-set map.  The C programs never look it up themselves (the generated
// policy programs do, by fd); it is declared here so that Felix's map name and
// layout are fixed in one place and the objects pin it.

#ifndef __CALI_POLICY_H__
#define __CALI_POLICY_H__

#include "bpf.h"
#include "policy_types.h"

#ifdef IPVER6
CALI_MAP(cali_ip_sets, cali_v6_ip_sets, "lpm_trie", struct ip6_set_key, __u32, 1048576, BPF_F_NO_PREALLOC);
#else
CALI_MAP(cali_ip_sets, cali_v4_ip_sets, "lpm_trie", struct ip4_set_key, __u32, 1048576, BPF_F_NO_PREALLOC);
#endif

#endif /* __CALI_POLICY_H__ */
