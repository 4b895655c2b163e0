// felixpy BPF dataplane programs.
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-or-later
//
// Logging.  Only the debug variants (CALI_LOG_LEVEL >= DEBUG) contain any
// bpf_trace_printk calls; in the fast variants CALI_DEBUG compiles to nothing.

#ifndef __CALI_LOG_H__
#define __CALI_LOG_H__

#include "bpf.h"

#if CALI_LOG_LEVEL >= CALI_LOG_LEVEL_DEBUG
/* bcc rewrites its own bpf_trace_printk() but refuses to do so inside a macro,
 * so call the helper directly, with the format on the stack and at most three
 * arguments (the helper's limit). */
#define __CALI_PRINTK3(fmt, a, b, c, ...) ({						\
	char ____fmt[] = fmt;								\
	((long (*)(const char *, __u32, __u64, __u64, __u64))BPF_FUNC_trace_printk)(	\
		____fmt, sizeof(____fmt), (__u64)(a), (__u64)(b), (__u64)(c));		\
})
#define CALI_DEBUG(fmt, ...) __CALI_PRINTK3("cali: " fmt "\n", ##__VA_ARGS__, 0, 0, 0)
#else
#define CALI_DEBUG(fmt, ...) do { } while (0)
#endif

#endif /* __CALI_LOG_H__ */
