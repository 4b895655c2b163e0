"""``felixpy explain``: which way a packet goes through the rules felixpy put in the kernel.

It reads the *live* kernel state — never the daemon's memory, so it works with
the daemon running or stopped — and evaluates one packet against it:

* :mod:`.readers` — one reader per *tables mode behind the :class:`~.readers.Reader`
  protocol (iptables-legacy, iptables-nft, nftables), :class:`~.readers.BPFReader` for BPF
  mode's pins, and :func:`~.readers.read_kernel`, which finds whose chains hold felixpy's state;
* :mod:`.bpf` — BPF mode: ``cali_iface``, the policy jump maps, the policy programs' pinned
  sources, the IP-set and routes maps, and the programs' semantics for one packet;
* :mod:`.ipt_parse`, :mod:`.nft_parse`, :mod:`.ipset_parse`, :mod:`.host` — small pure
  parsers of ``ip[6]tables-save``, ``nft -j list table``, ``ipset save`` and ``ip -j``
  output into :mod:`.ruleset` (rules as the typed criteria of
  :mod:`felixpy.drivers.generictables.model`, parsed lazily per chain);
* :mod:`.nft_netlink` — nftables chains, sets and maps read one object at a time over
  netlink and decompiled into the same criteria (what nft's CLI costs per listing at
  1,000 IP sets is why); what it cannot decode is listed with nft instead;
* :mod:`.evaluate` — netfilter's traversal (hooks in priority order, jumps, gotos,
  returns, marks, verdict maps) for a NEW packet, recording every rule that fired;
* :mod:`.path` — the trace mapped back to what an operator thinks in: hook, dispatch
  and endpoint chains, tiers, policies (name from the policy chain's first-rule
  comment, which holds the full name even when the chain name is hashed), the
  deciding rule, IP-set memberships, the verdict; :mod:`.output` prints it.
"""
