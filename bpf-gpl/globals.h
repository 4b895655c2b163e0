// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later

#ifndef __CALI_GLOBALS_H__
#define __CALI_GLOBALS_H__

#include "bpf.h"
#include "globals_types.h"

#if CALI_F_XDP
/* key: u32 ifindex (host order) */
CALI_MAP(xdp_cali_glob, xdp_cali_glob, "hash", __u32, struct cali_xdp_preamble_globals, 1000, BPF_F_NO_PREALLOC);
#else
CALI_MAP(cali_ap_glob, cali_ap_glob, "hash", struct cali_ap_key, struct cali_tc_preamble_globals, 4000,
	 BPF_F_NO_PREALLOC);
#endif

#endif /* __CALI_GLOBALS_H__ */
