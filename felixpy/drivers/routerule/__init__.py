"""Route rule driver (``ip rule`` entries pointing at Calico's tables); see :mod:`.rules`, contract in :mod:`.api`."""

from felixpy.drivers.routerule.api import RouteRulesAPI, make_rule, match_src_fwmark, match_src_fwmark_table
from felixpy.drivers.routerule.rules import RouteRules

__all__ = ["RouteRules", "RouteRulesAPI", "make_rule", "match_src_fwmark", "match_src_fwmark_table"]
