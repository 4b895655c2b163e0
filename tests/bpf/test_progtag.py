"""The kernel's program tag computed before loading (:mod:`felixpy.bpf.progtag`): map fds do not count,
everything else does.  (That it equals the tag the running kernel gives is checked where the restart
adopts programs: tests/bpf/test_restart_driver_kernel.py.)"""

from __future__ import annotations

import struct

from felixpy.bpf import progtag


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, dst | (src << 4), off, imm)


def map_load(fd: int, src: int = 1) -> bytes:
    return insn(0x18, 1, src, 0, fd) + insn(0, imm=0)


EXIT = insn(0xB7, 0, 0, 0, 0) + insn(0x95)


def test_the_map_fd_does_not_change_the_tag_but_the_code_does() -> None:
    a, b = map_load(5) + EXIT, map_load(9) + EXIT
    assert progtag.tags(a) == progtag.tags(b)
    assert progtag.masked(a) == progtag.masked(b) and progtag.masked(a) != a
    other = map_load(5) + insn(0xB7, 0, 0, 0, 1) + insn(0x95)  # returns 1, not 0
    assert progtag.tags(other).isdisjoint(progtag.tags(a))


def test_a_plain_64_bit_constant_is_part_of_the_tag() -> None:
    const = insn(0x18, 1, 0, 0, 5) + insn(0, imm=0) + EXIT  # src 0: a number, not a map
    assert progtag.masked(const) == const
    assert progtag.tags(const).isdisjoint(progtag.tags(insn(0x18, 1, 0, 0, 6) + insn(0, imm=0) + EXIT))


def test_map_fds_lists_every_map_the_code_loads() -> None:
    code = map_load(5) + map_load(7, src=2) + insn(0x18, 1, 0, 0, 99) + insn(0) + EXIT
    assert progtag.map_fds(code) == {5, 7}
    assert len(next(iter(progtag.tags(code)))) == progtag.TAG_SIZE
