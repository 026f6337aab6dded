# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the cluster side's last apply left in the cluster, and drift from it.

The node side keeps its record on each node (/var/lib/gpufleet/applied.json); the
cluster side keeps its own in the cluster, in the ConfigMap RECORD_NAME of its
namespace: every object the last apply sent, and the labels it gave each Node. A
probe reads the record, the owned objects and the Nodes, and `drift` says where the
cluster no longer holds what was sent: an object deleted, a field we set edited or
removed, a label removed or changed. Fields the API server or others add (defaults,
status, someone else's labels) are not drift.

Pure functions of plain data; the role's tasks do the reading and writing.
"""

from __future__ import annotations

import json

RECORD_NAME = "gpufleet-applied"
RECORD_KEY = "applied.json"
RECORD_VERSION = 1


def object_key(obj):
    """Kind/namespace/name (Kind//name for cluster-wide objects)."""
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('namespace', '')}/{meta.get('name')}"


def parse_record(configmap):
    """The record held by the ConfigMap (a k8s_info resource), or None."""
    if not configmap:
        return None
    text = (configmap.get("data") or {}).get(RECORD_KEY)
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    return record


def new_record(previous, objects, nodes, hosts):
    """The record after an apply that sent `objects` and labelled `nodes` ([{host,
    name, labels}]). A Node this apply did not label (its host had no facts in the
    run) keeps its previous entry while its host is among `hosts`."""
    kept = {}
    for name, entry in ((previous or {}).get("nodes") or {}).items():
        if entry.get("host") in hosts:
            kept[name] = entry
    for node in nodes:
        kept[node["name"]] = {"host": node["host"], "labels": dict(node["labels"])}
    return {
        "version": RECORD_VERSION,
        "objects": {object_key(o): o for o in objects},
        "nodes": dict(sorted(kept.items())),
    }


def record_configmap(record, namespace, part_of="gpufleet"):
    """The ConfigMap that holds `record`. It carries no ownership label, so pruning,
    which deletes owned objects no longer wanted, never takes it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": RECORD_NAME,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": part_of},
        },
        "data": {RECORD_KEY: json.dumps(record, sort_keys=True, separators=(",", ":"))},
    }


def missing(sent, live, path=""):
    """Where `live` does not hold what was `sent`: a list of paths.

    Maps: every key sent must be there, recursively — except a zero value (empty
    string, list or map, 0, false, null), which the API server leaves out of what it
    returns. Lists of maps that all have a `name` are matched by name (containers,
    volumes, ports); other lists must have the same length and hold each sent item
    in place. Scalars must be equal."""
    if isinstance(sent, dict):
        if not isinstance(live, dict):
            return [path or "."]
        found = []
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            if key not in live:
                if not _zero(value):
                    found.append(where)
            else:
                found.extend(missing(value, live[key], where))
        return found
    if isinstance(sent, list):
        if not isinstance(live, list):
            return [path]
        named = sent and all(isinstance(i, dict) and "name" in i for i in sent)
        if named:
            by_name = {i.get("name"): i for i in live if isinstance(i, dict)}
            found = []
            for item in sent:
                where = f"{path}[{item['name']}]"
                if item["name"] not in by_name:
                    found.append(where)
                else:
                    found.extend(missing(item, by_name[item["name"]], where))
            return found
        if len(sent) != len(live):
            return [path]
        found = []
        for index, (item, other) in enumerate(zip(sent, live)):
            found.extend(missing(item, other, f"{path}[{index}]"))
        return found
    # A quantity or port sent as a number may come back as a string, and vice versa.
    same = sent == live or (not isinstance(sent, bool) and str(sent) == str(live))
    return [] if same else [path]


def drift(record, live_objects, live_nodes):
    """Drift of the cluster from `record`: [{component, kind, name, host, recorded,
    current}], in the shape the node probe reports (component "cluster")."""
    found = []
    live = {object_key(o): o for o in live_objects}
    for key, sent in sorted(((record or {}).get("objects") or {}).items()):
        kind, _namespace, name = key.split("/", 2)
        current = live.get(key)
        if current is None:
            found.append(_item(kind, name, None, "recorded", None))
            continue
        paths = missing(_comparable(sent), current)
        if paths:
            found.append(_item(kind, name, None, "recorded", "changed: " + ", ".join(paths[:5])))
    nodes = {(n.get("metadata") or {}).get("name"): n for n in live_nodes}
    for name, entry in sorted(((record or {}).get("nodes") or {}).items()):
        node = nodes.get(name)
        if node is None:
            # The Node left the cluster (a node removed or renamed): nothing to label.
            continue
        labels = (node.get("metadata") or {}).get("labels") or {}
        wanted = entry.get("labels") or {}
        changed = {k: v for k, v in wanted.items() if labels.get(k) != v}
        if changed:
            current = {k: labels.get(k) for k in changed}
            found.append(_item("node-labels", name, entry.get("host"), changed, current))
    return found


def _zero(value):
    """A value Kubernetes' JSON leaves out (Go's omitempty)."""
    return value is None or value is False or value == 0 or value in ("", [], {})


def _item(kind, name, host, recorded, current):
    return {
        "component": "cluster",
        "kind": kind,
        "name": name,
        "host": host,
        "recorded": recorded,
        "current": current,
    }


def _comparable(obj):
    """What of a sent object the cluster must still hold (status is not ours)."""
    return {k: v for k, v in obj.items() if k != "status"}
