"""Feeds: sources of Felix's ``ToDataplane`` stream other than a live Felix.

* :mod:`felixpy.feed.framing` — the 8-byte little-endian length-prefixed wire
  framing of Felix's external-driver pipes (and felixpy's unix socket), plus
  raw framed recordings for record/replay;
* :mod:`felixpy.feed.scenario` — human-written YAML scenarios turned into an
  ordered message stream (format: docs/scenario-format.md), with
  :mod:`~felixpy.feed.scenario_sections`, :mod:`~felixpy.feed.scenario_rules`
  and :mod:`~felixpy.feed.protofill` as its parts;
* :mod:`felixpy.feed.client` — the sending side: streams messages to a daemon.

Import the submodules directly; this package imports nothing itself.
"""

from __future__ import annotations
