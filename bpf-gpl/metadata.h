// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// XDP -> TC metadata: XDP writes one u32 of flags in front of the packet
// (bpf_xdp_adjust_meta); the from-HEP TC program reads it via skb->data_meta.

#ifndef __CALI_METADATA_H__
#define __CALI_METADATA_H__

#define CALI_META_ACCEPTED_BY_XDP 0x80

struct cali_metadata {
	__u32 flags;
};

#endif /* __CALI_METADATA_H__ */
