// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Common definitions for every program: compile-time specialisation flags, the
// CALI_F_* predicates derived from them, skb mark bits, verdicts and the map
// declaration macro.
//
// Programs are compiled by bcc (clang 14) from Python (felixpy/bpf/build.py);
// per-variant specialisation arrives as -D flags:
//   CALI_COMPILE_FLAGS  bits below (endpoint type, direction, XDP, preamble)
//   CALI_LOG_LEVEL      0 = fast path, 10 = debug path (bpf_trace_printk)
//   IPVER6              build the IPv6 flavour
//   CALI_PIN_ROOT       bpffs directory holding the shared pinned maps

#ifndef __CALI_BPF_H__
#define __CALI_BPF_H__

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/icmpv6.h>

#define CALI_BPF_INLINE inline __attribute__((always_inline))

#define CALI_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)

/* CALI_COMPILE_FLAGS bits (values mirrored in felixpy/bpf/defs.py). */
#define CALI_TC_HOST_EP		(1 << 0)
#define CALI_TC_INGRESS		(1 << 1)
#define CALI_TC_TUNNEL		(1 << 2)
#define CALI_CGROUP		(1 << 3)
#define CALI_TC_DSR		(1 << 4)
#define CALI_TC_L3_DEV		(1 << 5)
#define CALI_XDP_PROG		(1 << 6)
#define CALI_TC_NAT_IF		(1 << 7)
#define CALI_TC_LO		(1 << 8)
#define CALI_CT_CLEANUP		(1 << 9)
#define CALI_TC_VXLAN		(1 << 10)
#define CALI_TC_PREAMBLE	(1 << 11)
#define CALI_TC_DEF_POLICY	(1 << 12)

#ifndef CALI_COMPILE_FLAGS
#define CALI_COMPILE_FLAGS 0
#endif

#ifndef CALI_PIN_ROOT
#define CALI_PIN_ROOT "/sys/fs/bpf/tc/globals"
#endif

/* "INGRESS" is the policy direction relative to the endpoint: set for to-WEP
 * (workload ingress policy) and for from-HEP (host ingress policy). */
#define CALI_F_HEP		((CALI_COMPILE_FLAGS) & (CALI_TC_HOST_EP | CALI_TC_NAT_IF))
#define CALI_F_WEP		(!CALI_F_HEP)
#define CALI_F_XDP		(((CALI_COMPILE_FLAGS) & CALI_XDP_PROG) != 0)
#define CALI_F_INGRESS		(((CALI_COMPILE_FLAGS) & CALI_TC_INGRESS) != 0)
#define CALI_F_EGRESS		(!CALI_F_INGRESS)
#define CALI_F_FROM_WEP		(CALI_F_WEP && CALI_F_EGRESS)
#define CALI_F_TO_WEP		(CALI_F_WEP && CALI_F_INGRESS)
#define CALI_F_FROM_HEP		(CALI_F_HEP && CALI_F_INGRESS)
#define CALI_F_TO_HEP		(CALI_F_HEP && CALI_F_EGRESS)
/* Towards the host namespace: the kernel's TC ingress hook. */
#define CALI_F_TO_HOST		(CALI_F_FROM_HEP || CALI_F_FROM_WEP)
#define CALI_F_FROM_HOST	(!CALI_F_TO_HOST)
#define CALI_F_PREAMBLE		(((CALI_COMPILE_FLAGS) & CALI_TC_PREAMBLE) != 0)
/* FIB forwarding is done by programs that see packets heading into the host. */
#define CALI_FIB_ENABLED	(CALI_F_TO_HOST && !CALI_F_XDP)

/* Kernel TC hook this object attaches to. */
#define CALI_HOOK_INGRESS	0
#define CALI_HOOK_EGRESS	1
#define CALI_HOOK_XDP		2
#if CALI_F_XDP
#define CALI_HOOK		CALI_HOOK_XDP
#elif CALI_F_TO_HOST
#define CALI_HOOK		CALI_HOOK_INGRESS
#else
#define CALI_HOOK		CALI_HOOK_EGRESS
#endif

/* Log levels (CALI_LOG_LEVEL). */
#define CALI_LOG_LEVEL_OFF	0
#define CALI_LOG_LEVEL_INFO	5
#define CALI_LOG_LEVEL_DEBUG	10
#ifndef CALI_LOG_LEVEL
#define CALI_LOG_LEVEL CALI_LOG_LEVEL_OFF
#endif

/* skb->mark bits, all within 0x1FF00000 (enum calico_skb_mark). */
#define CALI_SKB_MARK_SEEN			0x01000000
#define CALI_SKB_MARK_SEEN_MASK			CALI_SKB_MARK_SEEN
#define CALI_SKB_MARK_BYPASS			0x03000000
#define CALI_SKB_MARK_BYPASS_MASK		0x03f00000
#define CALI_SKB_MARK_BYPASS_FWD		0x03300000
#define CALI_SKB_MARK_BYPASS_XDP		0x03500000
#define CALI_SKB_MARK_FALLTHROUGH		0x05000000
#define CALI_SKB_MARK_NAT_OUT			0x03800000	/* BYPASS | 0x00800000: iptables MASQUERADEs */
#define CALI_SKB_MARK_MASQ			0x03600000	/* BYPASS | 0x00600000: "BPF loopback SNAT" */
#define CALI_SKB_MARK_SKIP_FIB			0x01100000
#define CALI_SKB_MARK_CT_ESTABLISHED		0x08000000
#define CALI_SKB_MARK_CT_ESTABLISHED_MASK	0x08000000

#define skb_seen(skb)	(((skb)->mark & CALI_SKB_MARK_SEEN_MASK) == CALI_SKB_MARK_SEEN)

#ifndef TC_ACT_UNSPEC
#define TC_ACT_UNSPEC	(-1)
#endif

/* bpf_fib_lookup flag (uapi 6.3); bcc 0.26's headers predate it. */
#define CALI_FIB_LOOKUP_SKIP_NEIGH	(1U << 2)

/* bcc 0.26 declares bpf_redirect_neigh with the pre-5.10 three-argument
 * prototype; call the helper with the kernel's real signature. */
#define cali_redirect_neigh(ifindex, params, plen, flags) \
	((long (*)(__u32, void *, int, __u64))BPF_FUNC_redirect_neigh)(ifindex, params, plen, flags)
#define cali_redirect_peer(ifindex, flags) \
	((long (*)(__u32, __u64))BPF_FUNC_redirect_peer)(ifindex, flags)

/* Map declaration.  Every map is pinned at CALI_PIN_ROOT/<pinned name>, where
 * the pinned name is Felix's: base name + version suffix (cali_v4_ct4).  The
 * Python side creates each pin first, naming the kernel map after the pin, so
 * all objects share one instance and a fresh process recognises the maps as
 * ours.  The C identifier (IDENT) is family-neutral (cali_ct, not
 * cali_v4_ct4) because bcc cannot rewrite map method calls that come from a
 * macro expansion, so code must name maps directly. */
#define __CALI_PIN(n)	CALI_PIN_ROOT "/" #n
#define CALI_MAP(ident, pinned, type, ktype, vtype, size, flags) \
	BPF_TABLE_PINNED(type, ktype, vtype, ident, size, __CALI_PIN(pinned), flags)

#endif /* __CALI_BPF_H__ */
