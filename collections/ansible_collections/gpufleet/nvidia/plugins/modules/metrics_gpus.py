#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: metrics_gpus
short_description: Read a metrics page served on the node and say which GPUs it reports
version_added: 0.2.0
description:
  - Fetches a Prometheus text page from the node itself (a GPU exporter's C(/metrics))
    and returns the C(gpu) label of every sample whose metric name starts with
    O(prefix), each once, as dcgm-exporter labels its DCGM fields.
  - Fails when the page cannot be read or answers another status than 200, saying why;
    with C(until)/C(retries) a task waits for an exporter that is starting.
  - Reads only; nothing on the node changes. The same as M(ansible.builtin.uri) and a
    count over its content, in one module run (M(ansible.builtin.uri) makes a remote
    temporary directory, three more round trips to the node).
options:
  url:
    description: The page, C(http://HOST:PORT/PATH).
    type: str
    required: true
  prefix:
    description: Only samples of metrics whose name starts with this count.
    type: str
    default: DCGM_FI_
  timeout:
    description: Seconds to wait for the page.
    type: int
    default: 10
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ask dcgm-exporter which GPUs it reports
  gpufleet.nvidia.metrics_gpus:
    url: http://localhost:9400/metrics
  register: scraped
  retries: 10
  delay: 2
  until: scraped is succeeded
"""

RETURN = r"""
status:
  description: The HTTP status of the answer (-1 where there was none).
  returned: always
  type: int
gpus:
  description: The C(gpu) label values the page's samples carry, sorted, each once.
  returned: success
  type: list
  elements: str
samples:
  description: How many samples of metrics whose name starts with O(prefix) the page holds.
  returned: success
  type: int
"""

import re
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

# A sample line: NAME{label="value",...} VALUE (labels optional).
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s")
_GPU_LABEL = re.compile(r'(?:^|,)\s*gpu="([^"]*)"')


def gpus_reported(text, prefix):
    """The sorted `gpu` label values of the samples of metrics whose name starts with
    `prefix`, and how many such samples there are."""
    gpus, samples = set(), 0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or not match.group(1).startswith(prefix):
            continue
        samples += 1
        label = _GPU_LABEL.search(match.group(2) or "")
        if label:
            gpus.add(label.group(1))
    return sorted(gpus, key=lambda gpu: (len(gpu), gpu)), samples


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "prefix": {"type": "str", "default": "DCGM_FI_"},
            "timeout": {"type": "int", "default": 10},
        },
        supports_check_mode=True,
    )
    url = module.params["url"]
    try:
        with urllib.request.urlopen(url, timeout=module.params["timeout"]) as answer:
            status, text = answer.status, answer.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        module.fail_json(msg=f"{url} answered {exc.code} {exc.reason}", status=exc.code)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        module.fail_json(msg=f"{url} could not be read: {reason}", status=-1)
    if status != 200:
        module.fail_json(msg=f"{url} answered {status}", status=status)
    gpus, samples = gpus_reported(text, module.params["prefix"])
    module.exit_json(changed=False, status=status, gpus=gpus, samples=samples)


if __name__ == "__main__":
    main()
