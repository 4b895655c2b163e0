"""BPF-mode workload programming: the endpoint driver, the attach layer and the shared kernel
bundle (see each module's docstring); managers name only :mod:`.api`."""

from felixpy.drivers.bpfendpoints.api import BPFEndpointsAPI, WorkloadPolicy
from felixpy.drivers.bpfendpoints.driver import BPFEndpoints, EndpointProgrammingFailed
from felixpy.drivers.bpfendpoints.kernel import BPFKernel, open_kernel

__all__ = ["BPFEndpoints", "BPFEndpointsAPI", "BPFKernel", "EndpointProgrammingFailed", "WorkloadPolicy",
           "open_kernel"]
