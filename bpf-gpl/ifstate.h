// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later

#ifndef __CALI_IFSTATE_H__
#define __CALI_IFSTATE_H__

#include "bpf.h"
#include "ifstate_types.h"

CALI_MAP(cali_iface, cali_iface4, "hash", __u32, struct ifstate_val, 1000, BPF_F_NO_PREALLOC);

#ifdef IPVER6
#define IFACE_STATE_READY IFACE_STATE_V6_READY
#else
#define IFACE_STATE_READY IFACE_STATE_V4_READY
#endif

#endif /* __CALI_IFSTATE_H__ */
