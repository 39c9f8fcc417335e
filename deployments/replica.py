"""Public alias: ``import_path: deployments.replica:build_slot`` of earlier rendered configs.

The slot deployment lives in ``deployments.slot.replica``; this module *is* that module.
"""

import sys

from deployments.slot import replica as _replica

sys.modules[__name__] = _replica
