"""The eBPF dataplane: C programs in ``bpf-gpl/`` compiled with bcc, and everything Python needs
to drive them.

Modules, bottom-up:

* :mod:`.syscall` -- bpf(2) through libbpf (``libbpf.so.1`` via ctypes): maps, program load,
  pin, TEST_RUN, TCX links; no bcc, no LLVM.
* :mod:`.defs`, :mod:`.maptypes` -- constants and ctypes mirrors of the C structs.
* :mod:`.maps` -- map specs, pinned maps, in-memory fakes, bpffs helpers.
* :mod:`.build` -- compiling variants with bcc (cached per process); :mod:`.worker` does it in a
  short-lived process so the daemon never holds LLVM.
* :mod:`.hook` -- generic prog arrays and jump layouts; :mod:`.attachpoint` -- per-interface
  globals and log-path selection.
* :mod:`.asm`, :mod:`.polprog`, :mod:`.policy_ir`, :mod:`.from_proto`, :mod:`.policyload`,
  :mod:`.ipsets` -- policy programs as bytecode from the felixbackend proto.
* :mod:`.attach` -- clsact/TCX/XDP attach (the single place the attach mechanism is chosen).
* :mod:`.testrun`, :mod:`.pktgen` -- BPF_PROG_TEST_RUN and test packets.

See ``docs/bpf.md`` for the design.
"""
