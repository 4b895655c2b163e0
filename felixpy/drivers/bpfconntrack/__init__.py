"""BPF mode's conntrack lifecycle: the userspace scanner of ``cali_v4_ct4`` / ``cali_v6_ct4``
(:mod:`.scanner`); managers (and the config parser) name only :mod:`.api`, so importing this
package loads no BPF code."""
