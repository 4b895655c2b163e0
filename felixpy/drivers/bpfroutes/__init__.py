"""BPF mode's routes maps (``cali_v4_routes`` / ``cali_v6_routes``): the driver is :mod:`.driver`;
managers name only :mod:`.api`, so importing this package loads no BPF code."""
