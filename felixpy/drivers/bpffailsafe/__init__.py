"""BPF mode's failsafe-port maps (``cali_v4_fsafes2`` / ``cali_v6_fsafes2``): the driver is
:mod:`.driver`; managers name only :mod:`.api`, so importing this package loads no BPF code."""
