"""The assembler: encodings, label resolution, dropping of unreachable code."""

from __future__ import annotations

import struct

import pytest

from felixpy.bpf import asm


def decode(b: bytes) -> list[tuple[int, int, int, int, int]]:
    out = []
    for i in range(0, len(b), 8):
        op, regs, off, imm = struct.unpack_from("<BBhi", b, i)
        out.append((op, regs & 0xF, regs >> 4, off, imm))
    return out


def test_encodings() -> None:
    b = asm.Block()
    b.mov64_imm(asm.R0, 2)
    b.load(asm.W, asm.R1, asm.R9, 8)
    b.store_imm(asm.H, asm.R10, -4, 0x1234)
    b.alu32_imm(asm.AND, asm.R1, 0xFFFFFF00)
    b.ld_map_fd(asm.R1, 7)
    b.exit()
    assert decode(b.assemble()) == [
        (0xB7, 0, 0, 0, 2),  # mov64 r0, 2
        (0x61, 1, 9, 8, 0),  # ldxw r1, [r9+8]
        (0x6A, 10, 0, -4, 0x1234),  # sth [r10-4], 0x1234
        (0x54, 1, 0, 0, -256),  # and32 r1, 0xffffff00 (imm is a raw s32)
        (0x18, 1, 1, 0, 7), (0, 0, 0, 0, 0),  # ld_imm64 r1, map fd 7
        (0x95, 0, 0, 0, 0),
    ]


def test_forward_jumps_and_jmp32() -> None:
    b = asm.Block()
    b.jump(asm.JEQ, asm.R1, 5, "out", wide=False)
    b.mov64_imm(asm.R0, 1)
    b.label("out")
    b.exit()
    ins = decode(b.assemble())
    assert ins[0] == (0x16, 1, 0, 1, 5)  # jmp32 jeq r1, 5, +1
    assert b.num_jumps == 1


def test_unreachable_code_is_dropped() -> None:
    b = asm.Block()
    b.ja("a")
    b.mov64_imm(asm.R0, 9)  # unreachable: dropped
    b.jump(asm.JEQ, asm.R0, 0, "never")  # dropped, and so is its reference
    b.label("a")
    b.exit()
    b.label("unused")  # not referenced: stays unreachable
    b.mov64_imm(asm.R0, 1)
    assert len(decode(b.assemble())) == 2
    assert "never" not in b.referenced


def test_undefined_label_and_range() -> None:
    b = asm.Block()
    b.ja("nowhere")
    with pytest.raises(asm.AsmError):
        b.assemble()
    b = asm.Block()
    b.jump(asm.JEQ, asm.R1, 0, "far")
    for _ in range(40000):
        b.mov64_imm(asm.R0, 0)
    b.label("far")
    b.exit()
    with pytest.raises(asm.AsmError):
        b.assemble()
    with pytest.raises(asm.AsmError):
        b.label("far")
