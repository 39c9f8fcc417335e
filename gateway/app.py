"""Public alias: ``import_path: gateway.app:build_app`` in users' Serve configs.

The builders live in ``gateway.serve.app``; this module *is* that module (vLLM's way of
moving a module without breaking users), so ``serve run`` of an existing config works.
"""

import sys

from gateway.serve import app as _app

sys.modules[__name__] = _app
