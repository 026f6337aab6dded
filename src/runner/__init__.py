# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet's reconcile loop (python -m runner).

Layers, top to bottom: CLI -> reconcile loop -> Ansible adapter -> state store.
Lower layers never import higher ones.
"""

__version__ = "0.1.0"
