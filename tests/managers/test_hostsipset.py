from __future__ import annotations

from typing import Any

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.managers.hostsipset import HostsIPSetManager
from felixpy.rules.ipset_names import IPSET_ID_ALL_HOST_NETS as ALL_HOSTS
from felixpy.proto import felixbackend_pb2 as pb


class RecordingIPSets:
    ip_version = 4

    def __init__(self) -> None:
        self.sets: dict[str, tuple[IPSetMetadata, list[str]]] = {}

    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Any) -> None:
        self.sets[meta.set_id] = (meta, list(members))


def test_hosts_set_exists_from_the_start_and_tracks_host_metadata_per_family() -> None:
    for v, addr4, addr6, want in ((4, "198.18.0.2/24", "fd00:198::2", "198.18.0.2/32"),
                                  (6, "198.18.0.2", "fd00:198::2/64", "fd00:198::2/128")):
        ips = RecordingIPSets()
        m = HostsIPSetManager(v, ips, ["203.0.113.0/24", "2001:db8::/64", "bogus"], 1000)  # type: ignore[arg-type]
        m.complete_deferred_work()
        ext = "203.0.113.0/24" if v == 4 else "2001:db8::/64"
        assert ips.sets[ALL_HOSTS] == (IPSetMetadata(ALL_HOSTS, IPSetType.HASH_NET, 1000), [ext])
        m.on_update(pb.HostMetadataUpdate(hostname="node2", ipv4_addr=addr4, ipv6_addr=addr6))
        m.complete_deferred_work()
        assert sorted(ips.sets[ALL_HOSTS][1]) == sorted([ext, want])
        m.on_update(pb.HostMetadataRemove(hostname="node2"))
        m.complete_deferred_work()
        assert ips.sets[ALL_HOSTS][1] == [ext]
