// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Per-attach-point globals.  Felix bakes these into each preamble's .rodata and
// reloads the preamble on every attach; bcc cannot set .rodata before load and a
// compile costs ~0.3 s, so felixpy compiles one preamble per hook and keeps the
// per-interface values in a hash map keyed by (ifindex, hook) instead
// (cali_ap_glob / xdp_cali_glob).  The preamble copies the selected family's half
// into state slot 1, exactly where Felix's preamble copies its .rodata.
//
// Byte order: addresses NBO; every other field host order (Felix writes ports,
// MTU and flags in host order despite the __be typedefs).

#ifndef __CALI_GLOBALS_TYPES_H__
#define __CALI_GLOBALS_TYPES_H__

#include "ip_addr.h"

#define CALI_JUMPS_LEN 40

struct cali_tc_global_data {
	ipv6_addr_t host_ip;		/* 0   NBO; v4 uses word a */
	__u16 tunnel_mtu;		/* 16 */
	__u16 vxlan_port;		/* 18 */
	ipv6_addr_t intf_ip;		/* 20  NBO */
	__u32 ext_to_svc_mark;		/* 36 */
	__u16 psnat_start;		/* 40 */
	__u16 psnat_len;		/* 42 */
	ipv6_addr_t host_tunnel_ip;	/* 44  NBO */
	__u32 flags;			/* 60  enum cali_globals_flags */
	__u16 wg_port;			/* 64 */
	__u16 profiling;		/* 66 */
	__u32 natin_idx;		/* 68 */
	__u32 natout_idx;		/* 72 */
	__u32 overlay_tunnel_id;	/* 76 */
	__u8 iface_name[16];		/* 80 */
	__u32 log_filter_jmp;		/* 96  slot in cali_jump_*, ~0 = none */
	__u32 jumps[CALI_JUMPS_LEN];	/* 100 logical index -> physical slot, ~0 = unused */
	__s8 dscp;			/* 260 */
	__s8 istio_dscp;		/* 261 */
	__u8 __pad[2];			/* 262 */
	__u32 maglev_lut_size;		/* 264 */
	__u32 ipfrag_timeout;		/* 268 */
	__u32 host_ifindex;		/* 272 */
};					/* 276: natural layout, no padding */

CALI_STATIC_ASSERT(sizeof(struct cali_tc_global_data) == 276, "cali_tc_global_data size");

struct cali_tc_preamble_globals {
	struct cali_tc_global_data v4;
	struct cali_tc_global_data v6;
};					/* 552 */

enum cali_globals_flags {
	CALI_GLOBALS_RPF_OPTION_ENABLED		= 0x00000010,
	CALI_GLOBALS_RPF_OPTION_STRICT		= 0x00000020,
	CALI_GLOBALS_NO_DSR_CIDRS		= 0x00000080,
	CALI_GLOBALS_LO_UDP_ONLY		= 0x00000100,
	CALI_GLOBALS_REDIRECT_PEER		= 0x00000400,
	CALI_GLOBALS_NATOUTGOING_EXCLUDE_HOSTS	= 0x00001000,
};

/* Key of the attach-point globals map: host order. */
struct cali_ap_key {
	__u32 ifindex;
	__u32 hook;			/* CALI_HOOK_INGRESS / _EGRESS */
};

#define CALI_XDP_JUMPS_LEN 16

struct cali_xdp_globals {
	__u8 iface_name[16];
	__u32 jumps[CALI_XDP_JUMPS_LEN];
};					/* 80 */

struct cali_xdp_preamble_globals {
	struct cali_xdp_globals v4;
	struct cali_xdp_globals v6;
};					/* 160 */

CALI_STATIC_ASSERT(sizeof(struct cali_xdp_globals) == 80, "cali_xdp_globals size");

#endif /* __CALI_GLOBALS_TYPES_H__ */
