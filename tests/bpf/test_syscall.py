"""felixpy.bpf.syscall is a binding over libbpf: the entry points really are libbpf's, the opts
and info structs mirror the C headers, errors carry libbpf's errno, and the TCX link calls work
end to end (in a throwaway network namespace and a private bpffs)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from felixpy.bpf import attach, defs, maps
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError, VerifierError
from felixpy.testing import netns as nsutil

ENTRY_POINTS = [n for n in vars(sc) if n.startswith("_bpf_")] + ["_libbpf_num_possible_cpus"]


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF syscalls)")


def _mapping_of(addr: int) -> str:
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5] if len(parts) > 5 else ""
    return ""


def test_entry_points_are_libbpf() -> None:
    assert isinstance(sc.libbpf, ctypes.CDLL)
    assert os.path.basename(sc.libbpf._name) == "libbpf.so.1"
    real = os.path.realpath(_mapping_of(ctypes.cast(sc.libbpf.bpf_obj_get, ctypes.c_void_p).value
                                        or 0))
    assert os.path.basename(real).startswith("libbpf.so.1")
    assert len(ENTRY_POINTS) >= 17
    for name in ENTRY_POINTS:
        addr = ctypes.cast(getattr(sc, name), ctypes.c_void_p).value or 0
        assert os.path.realpath(_mapping_of(addr)) == real, name
    assert not hasattr(sc, "_libc")  # no raw syscall(2) path left


def test_import_maps_neither_bcc_nor_llvm() -> None:
    code = ("import sys, felixpy.bpf.syscall, felixpy.bpf.maps, felixpy.bpf.policyload;"
            "m = open('/proc/self/maps').read();"
            "print('bcc' in sys.modules, 'LLVM' in m or 'libclang' in m or 'libbcc' in m,"
            " 'libbpf.so.1' in m)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert out == ["False", "False", "True"]


# The mirrored structs: (ctypes class, C type, header); fields starting "_" are padding or an
# anonymous union checked through the members named in EXTRA.
STRUCTS: list[tuple[type[ctypes.Structure], str, str]] = [
    (sc.MapCreateOpts, "struct bpf_map_create_opts", "bpf/bpf.h"),
    (sc.ProgLoadOpts, "struct bpf_prog_load_opts", "bpf/bpf.h"),
    (sc.LinkCreateOpts, "struct bpf_link_create_opts", "bpf/bpf.h"),
    (sc.LinkUpdateOpts, "struct bpf_link_update_opts", "bpf/bpf.h"),
    (sc.ProgQueryOpts, "struct bpf_prog_query_opts", "bpf/bpf.h"),
    (sc.ProgTestRunOpts, "struct bpf_test_run_opts", "bpf/bpf.h"),
    (sc.TcHook, "struct bpf_tc_hook", "bpf/libbpf.h"),
    (sc.TcOpts, "struct bpf_tc_opts", "bpf/libbpf.h"),
    (sc.MapBatchOpts, "struct bpf_map_batch_opts", "bpf/bpf.h"),
    (sc.BpfMapInfo, "struct bpf_map_info", "linux/bpf.h"),
    (sc.BpfProgInfo, "struct bpf_prog_info", "linux/bpf.h"),
    (sc.BpfLinkInfo, "struct bpf_link_info", "linux/bpf.h"),
]
FULL_SIZE = {"bpf/bpf.h", "bpf/libbpf.h"}  # opts structs are mirrored whole (their sz); info structs as prefixes
EXTRA: dict[type[ctypes.Structure], dict[str, str]] = {
    sc.LinkCreateOpts: {"perf_event.bpf_cookie": "_u.perf_event_bpf_cookie",
                        "tracing.cookie": "_u.tracing_cookie",
                        "kprobe_multi.flags": "_u.kprobe_multi.flags",
                        "kprobe_multi.cookies": "_u.kprobe_multi.cookies"}}


def test_structs_match_c_headers(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    # Installed by scripts/setup.sh (make setup); their absence is a broken setup, not a skip.
    assert cc is not None, "no C compiler: run make setup (installs gcc)"
    assert Path("/usr/include/bpf/bpf.h").exists(), "no libbpf headers: run make setup (installs libbpf-dev)"
    checks: list[tuple[str, int]] = []  # (C expression, the value the ctypes mirror has)
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <bpf/bpf.h>",
             "#include <bpf/libbpf.h>", "#include <linux/bpf.h>", "int main(void) {"]
    for cls, ctype, header in STRUCTS:
        if header in FULL_SIZE:
            checks.append((f"sizeof({ctype})", ctypes.sizeof(cls)))
        fields = {f[0]: f[0] for f in cls._fields_ if not f[0].startswith("_")}
        fields.update(EXTRA.get(cls, {}))
        for c_member, py_member in fields.items():
            obj: type = cls
            off = 0
            for part in py_member.split("."):
                desc = getattr(obj, part)
                off += desc.offset
                obj = dict((n, t) for n, t, *_ in obj._fields_)[part]  # type: ignore[attr-defined]
            checks.append((f"offsetof({ctype}, {c_member})", off))
            checks.append((f"sizeof((({ctype} *)0)->{c_member})", ctypes.sizeof(obj)))
    for expr, _ in checks:
        lines.append(f'  printf("%zu\\n", (size_t)({expr}));')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-o", str(exe), str(src)], check=True, capture_output=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                          text=True).stdout.split()]
    mismatches = [(e, want, g) for (e, want), g in zip(checks, got, strict=True) if want != g]
    assert len(got) == len(checks) > 100
    assert not mismatches, mismatches


def _ret_prog(rc: int, name: str) -> int:
    """r0 = rc; exit"""
    insns = bytes([0xB7, 0, 0, 0]) + rc.to_bytes(4, "little", signed=True) + b"\x95" + bytes(7)
    return sc.prog_load(sc.PROG_TYPE_SCHED_CLS, insns, name=name)


def test_errors_carry_libbpf_errno() -> None:
    _need_root()
    fd = sc.map_create(sc.MAP_TYPE_HASH, 4, 4, 2, flags=sc.F_NO_PREALLOC, name="sc_test_errno")
    try:
        info = sc.map_info(fd)
        assert (info.type, info.key_size, info.value_size, info.max_entries, info.flags,
                info.name) == (sc.MAP_TYPE_HASH, 4, 4, 2, sc.F_NO_PREALLOC, "sc_test_errno")
        sc.map_update(fd, b"\1\0\0\0", b"\7\0\0\0", sc.NOEXIST)
        with pytest.raises(BPFSyscallError) as ei:
            sc.map_update(fd, b"\1\0\0\0", b"\7\0\0\0", sc.NOEXIST)
        assert (ei.value.cmd, ei.value.errno) == ("MAP_UPDATE_ELEM", errno.EEXIST)
        with pytest.raises(BPFSyscallError) as ei:
            sc.map_update(fd, b"\2\0\0\0", b"\7\0\0\0", sc.EXIST)
        assert ei.value.errno == errno.ENOENT
        sc.map_update(fd, b"\2\0\0\0", b"\7\0\0\0")
        with pytest.raises(BPFSyscallError) as ei:  # full
            sc.map_update(fd, b"\3\0\0\0", b"\7\0\0\0")
        assert ei.value.errno == errno.E2BIG
        assert sc.map_lookup(fd, b"\1\0\0\0", 4) == b"\7\0\0\0"
        assert sc.map_lookup(fd, b"\3\0\0\0", 4) is None
        keys, k = [], None
        while (k := sc.map_next_key(fd, k, 4)) is not None:
            keys.append(k)
        assert sorted(keys) == [b"\1\0\0\0", b"\2\0\0\0"]
        assert sc.map_delete(fd, b"\1\0\0\0") and not sc.map_delete(fd, b"\1\0\0\0")
        with pytest.raises(BPFSyscallError) as ei:  # a map is not a link
            sc.link_detach(fd)
        assert ei.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    with pytest.raises(BPFSyscallError) as ei:
        sc.obj_get("/nonexistent/felixpy-pin")
    assert (ei.value.cmd, ei.value.errno) == ("OBJ_GET", errno.ENOENT)
    with pytest.raises(VerifierError) as vi:  # "exit" with r0 never written
        sc.prog_load(sc.PROG_TYPE_SCHED_CLS, bytes([0x95]) + bytes(7), name="sc_test_bad")
    assert vi.value.errno == errno.EACCES and "R0 !read_ok" in vi.value.log
    assert sc.possible_cpus() >= (os.cpu_count() or 1)


def test_prog_info_and_test_run() -> None:
    _need_root()
    fd = _ret_prog(2, "sc_test_run")
    try:
        info = sc.prog_info(fd)
        assert (info.type, info.name, info.xlated_len, info.map_ids) == (
            sc.PROG_TYPE_SCHED_CLS, "sc_test_run", 16, ())
        r = sc.prog_test_run(fd, bytes(range(60)), repeat=3)
        assert r.retval == 2 and r.data_out == bytes(range(60)) and r.ctx_out == b""
        assert sc.prog_get_fd_by_id(info.id) >= 0
        ids, pid = [], 0
        while (pid := sc.prog_get_next_id(pid)) is not None:  # type: ignore[assignment]
            ids.append(pid)
        assert info.id in ids
    finally:
        os.close(fd)


@pytest.mark.kernel
def test_tcx_link_lifecycle() -> None:
    """Create/pin/query/update/replace/detach a TCX link on a veth in a throwaway
    namespace; the pin lives on a private bpffs."""
    _need_root()
    if not attach.tcx_supported():
        pytest.skip("kernel without TCX")
    ing = sc.ATTACH_TCX_INGRESS
    with nsutil.netns("fpysc") as ns, maps.private_bpffs() as root:
        nsutil.run_in(ns, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        fds: list[int] = []
        with nsutil.entered(ns):
            try:
                ifindex = socket.if_nametoindex("d0")
                p1, p2 = _ret_prog(0, "sc_test_p1"), _ret_prog(0, "sc_test_p2")
                fds += [p1, p2]
                id1, id2 = sc.prog_info(p1).id, sc.prog_info(p2).id
                pin = attach.tcx_pin_path(root, "d0", defs.HOOK_TC_INGRESS)

                link = attach.attach_tcx(ifindex, defs.HOOK_TC_INGRESS, p1, pin_path=pin)
                fds.append(link)
                ltype, lid, pid = sc.link_info(link)
                assert (ltype, pid) == (11, id1)  # BPF_LINK_TYPE_TCX
                assert sc.prog_query_tcx(ifindex, ing) == [id1]

                # Update in place through the pin: same link, new program.
                again = attach.attach_tcx(ifindex, defs.HOOK_TC_INGRESS, p2, pin_path=pin)
                fds.append(again)
                assert sc.link_info(again)[1:] == (lid, id2)
                assert sc.prog_query_tcx(ifindex, ing) == [id2]

                # BPF_F_REPLACE: the expected old program must match.
                with pytest.raises(BPFSyscallError) as ei:
                    sc.link_update(again, p1, old_prog_fd=p1)
                assert (ei.value.cmd, ei.value.errno) == ("LINK_UPDATE", errno.EPERM)
                sc.link_update(again, p1, old_prog_fd=p2)
                assert sc.prog_query_tcx(ifindex, ing) == [id1]

                # link_create flags reach the kernel: BPF_F_BEFORE puts the new link first.
                first = sc.link_create(p2, ifindex, ing, sc.F_BEFORE)
                fds.append(first)
                assert sc.prog_query_tcx(ifindex, ing) == [id2, id1]
                sc.link_detach(first)
                assert sc.prog_query_tcx(ifindex, ing) == [id1]

                # A detached pinned link answers ENOLINK; attach_tcx re-creates it.
                sc.link_detach(again)
                assert sc.prog_query_tcx(ifindex, ing) == []
                with pytest.raises(BPFSyscallError) as ei:
                    sc.link_update(again, p2)
                assert ei.value.errno == errno.ENOLINK
                fresh = attach.attach_tcx(ifindex, defs.HOOK_TC_INGRESS, p2, pin_path=pin)
                fds.append(fresh)
                assert sc.link_info(fresh)[1] != lid
                assert sc.prog_query_tcx(ifindex, ing) == [id2]
                attach.detach_tcx(fresh, pin_path=pin)
                assert sc.prog_query_tcx(ifindex, ing) == [] and not os.path.exists(pin)
                assert sc.prog_query_tcx(ifindex + 1000, ing) == []  # no such device
            finally:
                for fd in fds:
                    os.close(fd)


def _lpm_map(n: int) -> maps.Map:
    spec = next(s for s in maps.ALL_SPECS if s.name == "cali_v4_ip_sets")
    fd = sc.map_create(spec.map_type, spec.key_size, spec.value_size, n, flags=spec.flags, name="sc_test_batch")
    return maps.Map(spec, fd)


def test_set_many_writes_in_batches_and_a_bad_element_fails_alone_with_its_index(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``Map.set_many`` over a kernel LPM trie (an IP-set map): more than one batch chunk, every element
    written; a key the kernel refuses (a prefix longer than the key) fails with its own error and its
    index, what comes before it written and nothing after; a map the kernel refuses batches for is
    written one element at a time from then on."""
    from felixpy.bpf.ipsets import member_key_bytes

    _need_root()
    one = bytes(ctypes.c_uint32(1))
    m = _lpm_map(20000)
    try:
        monkeypatch.setattr(maps, "BATCH_CHUNK", 1000)
        calls = {"batch": 0}
        real_batch = sc.map_update_batch

        def counting(*a: object, **kw: object) -> None:
            calls["batch"] += 1
            real_batch(*a, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(sc, "map_update_batch", counting)
        keys = [member_key_bytes(7, f"10.1.{i >> 8}.{i & 255}/32", False) for i in range(2500)]
        m.set_many([(k, one) for k in keys])
        assert calls["batch"] == 3 and all(m.get(k) is not None for k in keys)
        bad = bytearray(member_key_bytes(8, "10.2.0.9/32", False) or b"")
        bad[0:4] = (9999).to_bytes(4, "little")  # prefixlen beyond the key: EINVAL
        more = [member_key_bytes(8, f"10.2.0.{i}/32", False) for i in range(6)]
        items = [(k, one) for k in more[:3]] + [(bytes(bad), one)] + [(k, one) for k in more[3:]]
        with pytest.raises(maps.WriteIncomplete) as exc:
            m.set_many(items)
        assert exc.value.done == 3 and exc.value.errno == errno.EINVAL
        assert [m.get(k) is not None for k in more] == [True, True, True, False, False, False]
        assert not m._no_batch  # the batch worked up to the bad element: not a map without batches

        def refusing(fd: int, keys: bytes, values: bytes, count: int, flags: int = sc.ANY) -> None:
            raise sc.BatchIncomplete("MAP_UPDATE_BATCH", errno.EINVAL, 0)

        monkeypatch.setattr(sc, "map_update_batch", refusing)
        m.set_many([(k, one) for k in more[3:]])
        assert m._no_batch and all(m.get(k) is not None for k in more)
    finally:
        os.close(m.fd)
