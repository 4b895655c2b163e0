// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// cali_iface4: interface state, key u32 ifindex (host order).  Value fields are
// host order; the policy indices are the jump-map slots Felix allocated (-1 =
// none) and let a restarted daemon reclaim them.  Changing this layout needs a
// version bump of the map name.

#ifndef __CALI_IFSTATE_TYPES_H__
#define __CALI_IFSTATE_TYPES_H__

struct ifstate_val {
	__u32 flags;
	char name[16];
	__s32 xdp_policy_v4;
	__s32 ingress_policy_v4;
	__s32 egress_policy_v4;
	__s32 xdp_policy_v6;
	__s32 ingress_policy_v6;
	__s32 egress_policy_v6;
	__s32 tc_filter_ingress;
	__s32 tc_filter_egress;
};

CALI_STATIC_ASSERT(sizeof(struct ifstate_val) == 52, "ifstate_val");

#define IFACE_STATE_WEP		0x1
#define IFACE_STATE_V4_READY	0x2
#define IFACE_STATE_V6_READY	0x4
#define IFACE_STATE_HEP		0x8
#define IFACE_STATE_BOND	0x10
#define IFACE_STATE_BOND_SLAVE	0x20
#define IFACE_STATE_VXLAN	0x40
#define IFACE_STATE_IPIP	0x80
#define IFACE_STATE_WIREGUARD	0x100
#define IFACE_STATE_L3		0x200
#define IFACE_STATE_NOT_MANAGED	0x400

#endif /* __CALI_IFSTATE_TYPES_H__ */
