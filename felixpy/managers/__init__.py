"""Managers: per-IP-family converters from proto messages to desired state.

A manager never touches the kernel (no subprocess, no pyroute2, no bpf). See
:mod:`felixpy.managers.base` for the contracts.
"""
