# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What apt says about a set of packages, read from its own output (pure functions).

`apt-cache policy` tells which versions the node's sources offer and at which pin
priority; `apt-get install --simulate` tells the transaction apt would carry out. Both
are read with LC_ALL=C, the wording apt prints in the C locale.
"""

from __future__ import annotations

import fnmatch
import re

# "     535.309.01-0+deb12u1 500" or " *** 535.261.03-1 100" in a version table.
_POLICY_VERSION = re.compile(r"^\s+(?:\*\*\* )?(\S+) (-?[0-9]+)$")
# "Inst name [old] (new origin [arch])" and "Remv name [old]" of --simulate.
_INST = re.compile(r"^Inst (\S+) (?:\[(\S+)\] )?\((\S+)")
_REMV = re.compile(r"^Remv (\S+)(?: \[(\S+)\])?")
_CONF = re.compile(r"^Conf (\S+) \((\S+)")
_DOWNGRADED = "The following packages will be DOWNGRADED:"
# dpkg's line under "dpkg: error processing package …": which script failed, how.
_SCRIPT_FAILED = re.compile(r"^ .* script subprocess returned error exit status [0-9]+$")
# " libcuda1 : Depends: …" and its continuation lines under "unmet dependencies".
_UNMET = re.compile(r"^ \S+ : |^\s+(?:Pre-?Depends|Depends|Conflicts|Breaks): ")


class AptSetError(ValueError):
    """The package set cannot be resolved; the message names package and version."""


def parse_policy(text):
    """{package: {installed, candidate, versions: [(version, priority), ...]}} from
    `apt-cache policy NAME...`; versions newest first, as apt lists them."""
    result, current = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = result.setdefault(
                line[:-1], {"installed": None, "candidate": None, "versions": []}
            )
            continue
        if current is None:
            continue
        stripped = line.strip()
        for key in ("installed", "candidate"):
            if stripped.startswith(key.capitalize() + ": "):
                value = stripped.split(": ", 1)[1]
                current[key] = None if value == "(none)" else value
        match = _POLICY_VERSION.match(line)
        if match:
            current["versions"].append((match.group(1), int(match.group(2))))
    return result


def installed(policy, names):
    """The packages of `names` installed now (their policy names an installed version):
    those a transaction removes. apt refuses a removal of a name it does not know."""
    return [name for name in names if (policy.get(name) or {}).get("installed")]


def upstream(version):
    """The upstream part of a Debian version: no epoch, no revision."""
    version = re.sub(r"^[0-9]+:", "", version)
    return version.rsplit("-", 1)[0] if "-" in version else version


def pick(policy, name, wanted):
    """The newest version of `name` whose upstream part is `wanted` that no pin forbids
    (priority below 0). Raises AptSetError naming what the sources offer instead."""
    entry = policy.get(name)
    offered = [version for version, priority in (entry or {}).get("versions", []) if priority >= 0]
    for version in offered:
        if fnmatch.fnmatchcase(upstream(version), wanted):
            return version
    instead = ", ".join(dict.fromkeys(offered)) or "nothing"
    raise AptSetError(f"{name} {wanted} (they offer {instead})")


def target_version(policy, version, same_version):
    """The upstream version the set installs: `version` where given, otherwise the
    candidate of the first package of `same_version`."""
    if version or not same_version:
        return version
    candidate = (policy.get(same_version[0]) or {}).get("candidate")
    if not candidate:
        raise AptSetError(f"{same_version[0]} is not available from the node's package sources")
    return upstream(candidate)


def specs(policy, install, same_version, version):
    """apt-get's arguments: `name=exact-version` for the packages that move together,
    the name alone for the others (and `name=version` as given). Every package the
    sources lack is named at once."""
    together, arguments, missing = set(same_version), [], []
    for name in install:
        if name not in together or not version or "=" in name:
            arguments.append(name)
            continue
        try:
            arguments.append(f"{name}={pick(policy, name, version)}")
        except AptSetError as exc:
            missing.append(str(exc))
    if missing:
        raise AptSetError("not available from the node's package sources: " + "; ".join(missing))
    return arguments


# dpkg's abbreviated status of a package installed whole: wanted installed or held,
# installed, no error flag (dpkg-query(1), db:Status-Abbrev).
WHOLE = ("ii ", "hi ")


def at_versions(policy, arguments):
    """Whether apt's policy has every package of `arguments` installed at the exact
    version asked (a bare name at its candidate) and none to remove: then apt-get
    install would change nothing, where dpkg has each of them whole (`whole`) and no
    package half-done (`dpkg --audit`)."""
    for argument in arguments:
        if argument.endswith("-"):
            return False
        name, _, version = argument.partition("=")
        entry = policy.get(name) or {}
        if entry.get("installed") is None or entry["installed"] != (version or entry["candidate"]):
            return False
    return bool(arguments)


def whole(status):
    """Whether dpkg has each package installed whole: `status` is what
    `dpkg-query --show --showformat='${db:Status-Abbrev}\\n' NAME...` printed, a line
    per package: wanted installed or held, installed, no error flag."""
    lines = status.splitlines()
    return bool(lines) and all(line[:3] in WHOLE for line in lines)


def parse_simulation(text):
    """The transaction of `apt-get install --simulate`: one entry per package with
    its action (install, upgrade, downgrade, remove, or configure: a package an
    earlier run left unconfigured) and versions (from, to)."""
    downgraded = _section(text, _DOWNGRADED)
    steps = []
    for line in text.splitlines():
        inst = _INST.match(line)
        if inst:
            name, old, new = inst.groups()
            action = (
                "install"
                if old is None
                else "downgrade"
                if name in downgraded or name.split(":")[0] in downgraded
                else "upgrade"
            )
            steps.append({"name": name, "action": action, "from": old, "to": new})
            continue
        conf = _CONF.match(line)
        if conf and conf.group(1) not in {step["name"] for step in steps}:
            # Left unconfigured by an earlier run: this one finishes it.
            steps.append(
                {"name": conf.group(1), "action": "configure", "from": None, "to": conf.group(2)}
            )
            continue
        remv = _REMV.match(line)
        if remv:
            steps.append(
                {"name": remv.group(1), "action": "remove", "from": remv.group(2), "to": None}
            )
    return steps


def undo(steps, held=()):
    """The transaction that puts back what `steps` change: every package upgraded,
    downgraded or removed at the version installed before, every new one removed;
    and which of them were held (`held`: apt-mark showhold), to hold again."""
    changed = [step["name"] for step in steps if step["from"]]
    return {
        "install": [f"{step['name']}={step['from']}" for step in steps if step["from"]],
        "remove": [step["name"] for step in steps if step["action"] == "install"],
        "hold": [name for name in changed if name.split(":")[0] in set(held)],
    }


def _section(text, header):
    names, inside = set(), False
    for line in text.splitlines():
        if line == header:
            inside = True
        elif inside and line.startswith("  "):
            names.update(line.split())
        else:
            inside = False
    return names


def refusal(text):
    """What apt said when it refused the set: its unmet dependencies, dpkg's errors
    and apt's E: lines."""
    said = ("E: ", "dpkg: error", "Error! ")
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.startswith(said) or _UNMET.match(line) or _SCRIPT_FAILED.match(line)
    ]
    return "; ".join(dict.fromkeys(lines)) or text.strip()


def summary(steps):
    """The transaction in words, by action: 'downgrade nvidia-smi, libcuda1; remove …'."""
    by_action = {}
    for step in steps:
        by_action.setdefault(step["action"], []).append(step["name"])
    return "; ".join(f"{action} {', '.join(names)}" for action, names in by_action.items())
