#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_read
short_description: Read several kinds of Kubernetes objects in one module run
version_added: 0.2.0
description:
  - Does for each entry of O(reads) what M(kubernetes.core.k8s_info) does for its one
    kind, with the same client and connection settings (kubernetes.core's), in one
    module run instead of one per kind, and returns each answer in the order asked.
  - Most of a kubernetes.core module run is the controller importing the Kubernetes
    client (about 0.7 CPU-seconds each on a small machine); the cluster side's drift
    probe reads about a dozen kinds every cycle, and an apply as many again to find what
    to prune.
  - Needs the C(kubernetes.core) collection and the C(kubernetes) Python library on the
    host it runs on (the controller), as the cluster side's roles do.
  - Reads only; changes nothing.
options:
  reads:
    description: What to read, one entry per kind.
    type: list
    elements: dict
    required: true
    suboptions:
      kind:
        description: The object kind, as for M(kubernetes.core.k8s_info).
        type: str
        required: true
      api_version:
        description: Its API group and version.
        type: str
        default: v1
      name:
        description: One object's name; all of the kind when left out.
        type: str
      namespace:
        description: The namespace to read in; every namespace when left out.
        type: str
      label_selectors:
        description: Label selectors the objects must match, as for M(kubernetes.core.k8s_info).
        type: list
        elements: str
        default: []
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
requirements:
  - kubernetes.core (collection)
  - kubernetes (Python library)
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the record of the last apply and the DaemonSets gpufleet owns
  gpufleet.nvidia.k8s_read:
    reads:
      - {kind: ConfigMap, namespace: gpu-operator, name: gpufleet-applied}
      - kind: DaemonSet
        api_version: apps/v1
        label_selectors: [app.kubernetes.io/managed-by=gpufleet]
  register: cluster_read
  delegate_to: localhost
"""

RETURN = r"""
results:
  description: One entry per entry of O(reads), in the same order, each as
    M(kubernetes.core.k8s_info) returns its one kind.
  returned: always
  type: list
  elements: dict
  contains:
    api_found:
      description: Whether the cluster serves the kind (false for a custom resource
        whose definition is not installed).
      type: bool
    resources:
      description: The objects found.
      type: list
      elements: dict
"""

import copy

from ansible_collections.kubernetes.core.plugins.module_utils.ansiblemodule import (
    AnsibleModule,
)
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import (
    AUTH_ARG_SPEC,
)
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import (
    get_api_client,
)
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import (
    AnsibleK8SModule,
)
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import (
    CoreException,
)
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.service import (
    K8sService,
)

READ_SPEC = dict(
    kind=dict(type="str", required=True),
    api_version=dict(type="str", default="v1"),
    name=dict(type="str"),
    namespace=dict(type="str"),
    label_selectors=dict(type="list", elements="str", default=[]),
)


def argspec():
    args = copy.deepcopy(AUTH_ARG_SPEC)
    args["reads"] = dict(type="list", elements="dict", required=True, options=READ_SPEC)
    return args


def main():
    module = AnsibleK8SModule(
        module_class=AnsibleModule, argument_spec=argspec(), supports_check_mode=True
    )
    try:
        service = K8sService(get_api_client(module), module)
        results = [
            service.find(
                read["kind"],
                read["api_version"],
                name=read["name"],
                namespace=read["namespace"],
                label_selectors=read["label_selectors"],
            )
            for read in module.params["reads"]
        ]
    except CoreException as e:
        module.fail_from_exception(e)
    module.exit_json(changed=False, results=results)


if __name__ == "__main__":
    main()
