# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a successful apply left on a node, recorded and compared (the node_state module).

A record names, per component (a stage of site.yml), the files, packages and services
that component manages, with their state then: a file's sha256, mode and owner; a
package's installed version and whether it is held; a service's unit-file and active
state. It also holds the node's own state: the loaded driver, each GPU's MIG mode and the
profiles of its MIG devices.
The probe reads the list of what to check from the record itself.

`Reader` asks the node (through injected `run` and `which` callables, so tests can
fake the programs); everything else is pure. Runs on the node: Python 3.8, no
third-party libraries.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import re
import stat
import time

from ansible_collections.gpufleet.nvidia.plugins.module_utils import (
    discovery,
    gpu_health,
    kernels,
    pci,
    smi,
)

SCHEMA = 1
DEFAULT_PATH = "/var/lib/gpufleet/applied.json"
# Item kinds of a component, and the word a drift entry uses for each.
KINDS = ("files", "packages", "services")
KIND_WORD = {"files": "file", "packages": "package", "services": "service"}
# Node-level differences are reported under these components.
NODE_COMPONENT = "driver"
MIG_COMPONENT = "mig"

_COMPONENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Debian and RPM package names (no version, no glob); systemd unit names.
_PACKAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")

# dnf's versionlock plugin keeps its locks here (RHEL 8 and later).
VERSIONLOCK_LISTS = ("/etc/dnf/plugins/versionlock.list",)
DPKG_QUERY_FORMAT = "${Package}|${Version}|${db:Status-Abbrev}\n"
RPM_QUERY_FORMAT = "%{NAME}|%|EPOCH?{%{EPOCH}:}:{}|%{VERSION}-%{RELEASE}\n"
SMI_FIELDS = ("pci.bus_id", "uuid", "serial", "mig.mode.current")
SYSTEMCTL_PROPERTIES = ("Id", "UnitFileState", "ActiveState")
# A unit on its way between two states (starting, stopping, reloading, or waiting to be
# restarted after it failed) is read again, once a second, for up to this many seconds
# before its state counts: a node probed just after it booted has services still
# starting, which is not drift, and a record written then would hold a state that
# passes.
TRANSITIONAL_STATES = ("activating", "deactivating", "reloading")
SETTLE_SECONDS = 10
_HASH_CHUNK = 1 << 20


class NodeStateError(ValueError):
    """Bad input to the module (a component list it cannot record)."""


class RecordError(ValueError):
    """The record file cannot be used; the message says why (the probe's `reason`)."""


# --- input --------------------------------------------------------------------------


def normalize_components(components):
    """{name: {files, packages, services}} with sorted, unique lists; raises NodeStateError."""
    if components is None:
        return {}
    if not isinstance(components, dict):
        raise NodeStateError(f"components: expected a dict, got {type(components).__name__}")
    result = {}
    for name, items in components.items():
        if not isinstance(name, str) or not _COMPONENT_RE.match(name):
            raise NodeStateError(f"components: {name!r} is not a component name")
        if items is None:
            items = {}
        if not isinstance(items, dict):
            raise NodeStateError(f"components.{name}: expected a dict of {', '.join(KINDS)}")
        unknown = sorted(set(items) - set(KINDS))
        if unknown:
            raise NodeStateError(
                f"components.{name}: unknown key(s) {', '.join(unknown)}; "
                f"expected {', '.join(KINDS)}"
            )
        entry = {}
        for kind in KINDS:
            values = items.get(kind) or []
            if isinstance(values, str) or not isinstance(values, (list, tuple)):
                raise NodeStateError(f"components.{name}.{kind}: expected a list")
            for value in values:
                _check_item(name, kind, value)
            entry[kind] = sorted(set(values))
        result[name] = entry
    return result


def _check_item(component, kind, value):
    where = f"components.{component}.{kind}"
    if not isinstance(value, str) or not value:
        raise NodeStateError(f"{where}: expected non-empty strings, got {value!r}")
    if kind == "files" and (not os.path.isabs(value) or os.path.normpath(value) != value):
        raise NodeStateError(f"{where}: {value!r} is not a normalised absolute path")
    if kind == "packages" and not _PACKAGE_RE.match(value):
        raise NodeStateError(f"{where}: {value!r} is not a package name (no versions or globs)")
    if kind == "services" and not _UNIT_RE.match(value):
        raise NodeStateError(f"{where}: {value!r} is not a systemd unit name")


def components_of(record):
    """The item lists a record covers, in the form normalize_components returns."""
    return {
        name: {kind: sorted(items.get(kind, {})) for kind in KINDS}
        for name, items in record["components"].items()
    }


def _all(components, kind):
    found = set()
    for items in components.values():
        found.update(items[kind])
    return sorted(found)


# --- reading the node ---------------------------------------------------------------


def file_state(path):
    """sha256, mode and owner of a file (following links); None when it does not exist."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"error": exc.strerror or str(exc)}
    state = {
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
        "owner": _name(pwd.getpwuid, info.st_uid),
        "group": _name(grp.getgrgid, info.st_gid),
    }
    if not stat.S_ISREG(info.st_mode):
        state["type"] = "directory" if stat.S_ISDIR(info.st_mode) else "other"
        return state
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(_HASH_CHUNK), b""):
                digest.update(chunk)
    except OSError as exc:
        state["error"] = exc.strerror or str(exc)
        return state
    state["sha256"] = digest.hexdigest()
    return state


def _name(lookup, number):
    try:
        return lookup(number)[0]
    except KeyError:
        return str(number)


def parse_dpkg_query(output):
    """{package: {version, held}} of installed packages, from DPKG_QUERY_FORMAT lines;
    with `state` (dpkg's word: half-configured, unpacked, ...) for one a failed or
    killed run left between two versions.

    db:Status-Abbrev is the wanted state (h: hold, what `apt-mark hold` and
    dpkg_selections set), then the current one (i: installed), then an error flag.
    """
    found = {}
    for line in output.splitlines():
        fields = line.split("|")
        if len(fields) != 3 or fields[0] in found:
            continue
        name, version, status = fields
        current = status[1:2]
        if current in discovery.DPKG_PRESENT:
            found[name] = {"version": version, "held": status[:1] == "h"}
            if current != "i":
                found[name]["state"] = discovery.DPKG_PRESENT[current]
    return found


def parse_rpm_query(output):
    """{package: version} from RPM_QUERY_FORMAT lines ("package x is not installed" skipped)."""
    found = {}
    for line in output.splitlines():
        fields = line.split("|")
        if len(fields) == 2 and fields[0] not in found:
            found[fields[0]] = fields[1]
    return found


def versionlocked(text):
    """Package names locked in a dnf versionlock.list (NAME-[EPOCH:]VERSION-RELEASE[.ARCH])."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):  # "!" lines exclude, they do not lock
            continue
        parts = line.rsplit("-", 2)
        if len(parts) == 3:
            names.add(re.sub(r"^[0-9]+:", "", parts[0]))
    return names


def parse_systemctl_show(output, units):
    """{unit: {unit_file_state, active_state}} from `systemctl show -p ... units`.

    systemctl prints one block of KEY=VALUE lines per unit, in the order asked, blocks
    separated by a blank line. A unit that does not exist has an empty UnitFileState.
    """
    blocks = []
    current = {}
    for line in output.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, _, value = line.partition("=")
        current[key] = value
    if current:
        blocks.append(current)
    if len(blocks) != len(units):
        raise ValueError(f"systemctl show gave {len(blocks)} block(s) for {len(units)} unit(s)")
    return {
        unit: {
            "unit_file_state": block.get("UnitFileState") or None,
            "active_state": block.get("ActiveState") or None,
        }
        for unit, block in zip(units, blocks)
    }


def _address(row):
    return (row.get("pci.bus_id") or "").lower()[-12:]


def mig_modes(rows):
    """{PCI address: MIG mode (True, False, None: not MIG-capable)} from nvidia-smi rows."""
    return {_address(row): row.get("mig.mode.current") for row in rows}


def mig_devices(rows, listed):
    """{PCI address: sorted profiles of its MIG devices} for the GPUs with MIG on, from
    nvidia-smi rows and `nvidia-smi -L` parsed (smi.parse_list). Where each instance
    sits is not part of it: a layout is the profiles and their counts."""
    return {
        _address(row): sorted(listed.get(row.get("uuid"), []))
        for row in rows
        if row.get("mig.mode.current")
    }


class Reader:
    """Reads the current state of items and of the node with a handful of programs.

    `run(argv)` returns (rc, stdout, stderr); `which(name)` a program's path or None.
    Problems that leave a state unknown are collected in `warnings`.
    """

    def __init__(
        self,
        run,
        which,
        sysfs_root="/sys",
        versionlock_lists=VERSIONLOCK_LISTS,
        sleep=time.sleep,
        settle_seconds=SETTLE_SECONDS,
    ):
        self.run = run
        self.which = which
        self.sysfs_root = sysfs_root
        self.versionlock_lists = versionlock_lists
        self.sleep = sleep
        self.settle_seconds = settle_seconds
        self.warnings = []
        self._answer = None  # nvidia-smi's rows and unreachable GPUs, asked once

    def files(self, paths):
        return {path: file_state(path) for path in paths}

    def packages(self, names):
        """One dpkg-query call (or one rpm call plus the versionlock list) for all names."""
        if not names:
            return {}
        dpkg_query = self.which("dpkg-query")
        if dpkg_query:
            _rc, out, _err = self.run([dpkg_query, "-W", "-f=" + DPKG_QUERY_FORMAT, *names])
            found = parse_dpkg_query(out)
            return {name: found.get(name) for name in names}
        rpm = self.which("rpm")
        if rpm:
            _rc, out, _err = self.run([rpm, "-q", "--qf", RPM_QUERY_FORMAT, *names])
            versions = parse_rpm_query(out)
            locked = set()
            for path in self.versionlock_lists:
                try:
                    with open(path, encoding="utf-8") as handle:
                        locked |= versionlocked(handle.read())
                except OSError:
                    pass
            return {
                name: {"version": versions[name], "held": name in locked}
                if name in versions
                else None
                for name in names
            }
        self.warnings.append("neither dpkg-query nor rpm found: package states unknown")
        return {name: {"error": "no package manager"} for name in names}

    def services(self, units):
        """One `systemctl show` call for all units; then, while some are in a
        transitional state, one a second for those, up to settle_seconds."""
        states = self._services(units)
        for _ in range(self.settle_seconds):
            moving = [u for u in units if states[u].get("active_state") in TRANSITIONAL_STATES]
            if not moving:
                break
            self.sleep(1)
            states.update(self._services(moving))
        return states

    def _services(self, units):
        if not units:
            return {}
        systemctl = self.which("systemctl")
        error = "systemctl not found"
        if systemctl:
            rc, out, err = self.run(
                [systemctl, "show", "-p", ",".join(SYSTEMCTL_PROPERTIES), *units]
            )
            if rc == 0:
                try:
                    return parse_systemctl_show(out, units)
                except ValueError as exc:
                    error = str(exc)
            else:
                error = f"systemctl show exited {rc}: {(err or out).strip()[:200]}"
        self.warnings.append(f"service states unknown: {error}")
        return {unit: {"error": error} for unit in units}

    def node(self):
        """The loaded driver (from sysfs, as gpu_facts reads it), each GPU's MIG mode and
        the MIG devices of the GPUs with MIG on.

        nvidia-smi is asked only when the nvidia module is loaded, and its device list
        only when a GPU has MIG on.
        """
        module_dir = os.path.join(self.sysfs_root, "module", "nvidia")
        version = _read(os.path.join(module_dir, "version"))
        taint = _read(os.path.join(module_dir, "taint"))
        driver = {
            "version": version or None,
            "module_type": discovery.module_type_from_taint(taint)
            if version and taint is not None
            else None,
        }
        modes, devices = self._mig() if version else (None, None)
        return {"driver": driver, "mig": modes, "mig_devices": devices}

    def _smi(self, args):
        binary = self.which("nvidia-smi")
        if not binary:
            self.warnings.append("the nvidia module is loaded but nvidia-smi is not installed")
            return None
        rc, out, err = self.run([binary, *args])
        if rc != 0:
            self.warnings.append(f"nvidia-smi exited {rc}: {(out or err).strip()[:200]}")
            return None
        return out

    def _rows(self):
        """nvidia-smi's rows (SMI_FIELDS and the health fields) and the GPUs it could not
        open, asked once for the MIG state and health; (None, {}) where it did not answer."""
        if self._answer is None:
            self._answer = None, {}
            binary = self.which("nvidia-smi")
            if not binary:
                self.warnings.append("the nvidia module is loaded but nvidia-smi is not installed")
                return self._answer
            try:
                rows, unreachable, error = gpu_health.query(self.run, binary, SMI_FIELDS)
            except smi.SmiParseError as exc:
                rows, unreachable, error = None, {}, str(exc)
            if error:
                self.warnings.append(error)
            self._answer = rows, unreachable
        return self._answer

    def _mig(self):
        rows, _unreachable = self._rows()
        if rows is None:
            return None, None
        try:
            modes = mig_modes(rows)
            if not any(modes.values()):
                return modes, {}
            listed = self._smi(["-L"])
            return modes, None if listed is None else mig_devices(rows, smi.parse_list(listed))
        except smi.SmiParseError as exc:
            self.warnings.append(str(exc))
            return None, None

    def health(self, overrides=None, kernel_log=gpu_health.KMSG):
        """The GPUs' health signals and the driver's Xid events, as gpu_facts reports them
        (its `health` fact, each GPU's keyed by PCI address under `gpus`); asks nvidia-smi
        only when the nvidia module is loaded (its rows are shared with the MIG state)."""
        loaded = _read(os.path.join(self.sysfs_root, "module", "nvidia", "version"))
        rows, unreachable = self._rows() if loaded else (None, {})
        addresses = [gpu.address for gpu in pci.nvidia_gpus(pci.scan(self.sysfs_root))]
        gpus = gpu_health.gpu_health(rows, unreachable, overrides, addresses)
        log, log_error = gpu_health.read_kernel_log(kernel_log)
        health = {
            "action": gpu_health.worst(h["action"] for h in gpus.values()),
            "gpus": gpus if rows is not None or unreachable else None,
            "xid_events": None if log is None else gpu_health.parse_kmsg(log, overrides),
            "boot_id": _read(gpu_health.BOOT_ID),
        }
        if log_error:
            health["kernel_log_error"] = log_error
        return health


def _read(path):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def current_record(reader, components):
    """The record of what `components` (normalised) and the node look like now."""
    files = reader.files(_all(components, "files"))
    packages = reader.packages(_all(components, "packages"))
    services = reader.services(_all(components, "services"))
    states = {"files": files, "packages": packages, "services": services}
    return {
        "schema": SCHEMA,
        "components": {
            name: {kind: {item: states[kind][item] for item in items[kind]} for kind in KINDS}
            for name, items in components.items()
        },
        "node": reader.node(),
    }


# --- the record file ----------------------------------------------------------------


def render(record):
    """The file's text: sorted keys, no timestamps, so an unchanged node gives the same bytes."""
    return json.dumps(record, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def digest(data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def load(data):
    """The record in `data` (bytes); RecordError saying what is wrong with it."""
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RecordError(f"corrupt: not JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise RecordError("corrupt: not a JSON object")
    if record.get("schema") != SCHEMA:
        raise RecordError(
            f"other schema: {record.get('schema')!r} (this module reads schema {SCHEMA})"
        )
    components = record.get("components")
    node = record.get("node")
    if not isinstance(components, dict) or not isinstance(node, dict):
        raise RecordError("corrupt: no components or node section")
    for name, items in components.items():
        if not isinstance(items, dict) or not all(
            isinstance(items.get(kind, {}), dict) for kind in KINDS
        ):
            raise RecordError(f"corrupt: component {name!r} is not a dict of {', '.join(KINDS)}")
        try:
            normalize_components({name: {kind: list(items.get(kind, {})) for kind in KINDS}})
        except NodeStateError as exc:
            raise RecordError(f"corrupt: {exc}") from exc
    return record


def compare(recorded, current):
    """{component: [{kind, name, recorded, current}]} for every item that differs."""
    drift = {}
    for name in sorted(recorded["components"]):
        rec_items = recorded["components"][name]
        cur_items = current["components"].get(name, {})
        for kind in KINDS:
            rec_kind = rec_items.get(kind, {})
            cur_kind = cur_items.get(kind, {})
            for item in sorted(rec_kind):
                if rec_kind[item] != cur_kind.get(item):
                    drift.setdefault(name, []).append(
                        {
                            "kind": KIND_WORD[kind],
                            "name": item,
                            "recorded": rec_kind[item],
                            "current": cur_kind.get(item),
                        }
                    )
    for component, entry in _node_drift(recorded["node"], current["node"]):
        drift.setdefault(component, []).append(entry)
    return drift


def _node_drift(recorded, current):
    """(component, entry) for each difference in the node's own state. The MIG devices
    are compared only where the record has them (records written before they were)."""
    entries = []
    rec_driver = recorded.get("driver")
    cur_driver = current.get("driver")
    if rec_driver != cur_driver:
        entries.append(
            (
                NODE_COMPONENT,
                {"kind": "driver", "name": "nvidia", "recorded": rec_driver, "current": cur_driver},
            )
        )
    keys = [("mig", "mig")] + (
        [("mig_devices", "mig-devices")] if "mig_devices" in recorded else []
    )
    for key, kind in keys:
        rec, cur = recorded.get(key), current.get(key)
        if rec == cur:
            continue
        rec_map, cur_map = rec or {}, cur or {}
        named = [
            {
                "kind": kind,
                "name": address,
                "recorded": rec_map.get(address),
                "current": cur_map.get(address),
            }
            for address in sorted(set(rec_map) | set(cur_map))
            if rec_map.get(address) != cur_map.get(address)
            or (address in rec_map) != (address in cur_map)
        ]
        # No GPU on one side to name: the states as a whole differ.
        named = named or [{"kind": kind, "name": "all", "recorded": rec, "current": cur}]
        entries.extend((MIG_COMPONENT, entry) for entry in named)
    return entries


def kernel_drift(kernel, recorded, signing_key=None):
    """Drift entries (component NODE_COMPONENT) for the kernel the node boots next when
    it lacks the nvidia module of the driver the last apply left (`recorded`'s), or for
    the kernel gpufleet's hold keeps the node from once it has the module (the hold is
    lifted by the driver stage); each says why in `reason`. `kernel` is kernels.read's;
    with `signing_key` (the site's certificate serial), a module not signed with it is
    drift too.
    Only where the driver stage installs the driver (its component records packages):
    a driver gpufleet leaves alone (pre-installed, driver_manage never) is not its to
    repair."""
    managed = ((recorded.get("components") or {}).get(NODE_COMPONENT) or {}).get("packages")
    if not managed:
        return []
    version = ((recorded.get("node") or {}).get("driver") or {}).get("version")
    found = kernels.problems(kernel, version, signing_key)
    release = kernel["boot_next"]
    grub = kernel.get("grub") or {}
    unheld = grub.get("unheld")
    if (
        not found
        and grub.get("held")
        and unheld
        and not kernels.problems(kernel, version, signing_key, unheld)
    ):
        release = unheld
        now = (
            f"the kernel the node was held back from is gone ({unheld} boots without the hold)"
            if unheld == grub["held"]
            else f"kernel {unheld} has the driver's module now"
        )
        found = [f"{now}: the boot default gpufleet held on {grub['held']} can be lifted"]
    if not found:
        return []
    module = kernel["modules"].get(release) or {}
    return [
        {
            "kind": "kernel",
            "name": release,
            "recorded": {"nvidia": version},
            "current": {"nvidia": module.get("version")},
            "reason": "; ".join(found),
        }
    ]
