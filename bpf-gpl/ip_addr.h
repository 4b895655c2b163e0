// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Address types.  All addresses are stored in network byte order (NBO) exactly
// as they appear in the packet.  IPv4 programs use a 32-bit address but every
// address *field* in shared structs (state, globals) is 16 bytes wide so that
// offsets are identical for both families.

#ifndef __CALI_IP_ADDR_H__
#define __CALI_IP_ADDR_H__

typedef struct {
	__be32 a;
	__be32 b;
	__be32 c;
	__be32 d;
} ipv6_addr_t;

typedef __be32 ipv4_addr_t;

#ifdef IPVER6
typedef ipv6_addr_t ipv46_addr_t;
#define DECLARE_IP_ADDR(name)	ipv6_addr_t name
#define ip_equal(x, y)	((x).a == (y).a && (x).b == (y).b && (x).c == (y).c && (x).d == (y).d)
#define ip_void(x)	((x).a == 0 && (x).b == 0 && (x).c == 0 && (x).d == 0)
/* Raw 32-bit word compare, in order a, b, c, d (as Felix orders CT keys). */
static CALI_BPF_INLINE int ip_cmp(ipv6_addr_t *x, ipv6_addr_t *y)
{
	if (x->a != y->a)
		return x->a < y->a ? -1 : 1;
	if (x->b != y->b)
		return x->b < y->b ? -1 : 1;
	if (x->c != y->c)
		return x->c < y->c ? -1 : 1;
	if (x->d != y->d)
		return x->d < y->d ? -1 : 1;
	return 0;
}
#else
typedef ipv4_addr_t ipv46_addr_t;
#define DECLARE_IP_ADDR(name)	union { ipv4_addr_t name; ipv6_addr_t __pad_##name; }
#define ip_equal(x, y)	((x) == (y))
#define ip_void(x)	((x) == 0)
static CALI_BPF_INLINE int ip_cmp(ipv4_addr_t *x, ipv4_addr_t *y)
{
	if (*x != *y)
		return *x < *y ? -1 : 1;
	return 0;
}
#endif

#endif /* __CALI_IP_ADDR_H__ */
