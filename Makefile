# gpufleet: the two commands that matter are
#   make demo   set everything up, start the simulated fleet, run the main job on it
#   make test   set everything up and run the whole test suite (what CI runs)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# The controller's Python: the distribution's /usr/bin/python3 where it is 3.11 or newer
# and can make a virtualenv, else python3 from PATH (host-deps.sh checks that one);
# PYTHON=... chooses another. Debian's and Ubuntu's builds are optimised (PGO, LTO), a
# default pyenv build is not, and Ansible's controller spends about a fifth more CPU
# on it (README, Requirements).
PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, ensurepip, venv; \
  sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo /usr/bin/python3 || echo python3)
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
FLEET := $(BIN)/python tests/sim/fleet.py
INVENTORY ?= inventories/sim

# Podman is configured through this file, never through /etc/containers.
export CONTAINERS_CONF := $(CURDIR)/tests/sim/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(BIN):$(PATH)
export ANSIBLE_FORCE_COLOR ?= 0
export NO_COLOR ?= 1
export PY_COLORS ?= 0

.PHONY: help deps venv dist docs setup builds consumers toolkit migparted image repo fleet fleet-down fleet-status controlplane cluster cluster-down demo test lint unit e2e e2e-cluster e2e-site e2e-nodes molecule molecule-cluster bench clean

help:
	@echo "make demo    start the simulated GPU fleet and run the main job on it"
	@echo "make test    run lint, unit, e2e tests and molecule scenarios (what CI runs)"
	@echo "make dist    build the controller's wheel into dist/ (pip install dist/gpufleet-*.whl)"
	@echo "make fleet | fleet-status | fleet-down | cluster | cluster-down | lint | unit | e2e | molecule | bench | docs | clean"

deps:
	@PYTHON=$(PYTHON) bash tests/sim/host-deps.sh

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

# Ansible loads the collection's filter and action plugins on the controller from their
# files, in each process it forks for a task, and reads their bytecode where there is
# some. pip compiles it into an installed controller; here it is compiled beside the
# sources (ignored by git) with the runner's and the fleet tool's Python, which an
# environment with PYTHONDONTWRITEBYTECODE set would otherwise leave to every process
# to compile again (a steady pass over one T4 about 4% less controller CPU).
BYTECODE := $(addprefix collections/ansible_collections/gpufleet/nvidia/plugins/,filter action) \
  src $(wildcard tests/sim/*.py)
venv: deps $(VENV)/.installed
	@$(BIN)/python -m compileall -q $(BYTECODE)

# The controller as one wheel: the runner with the playbooks, roles and collection it
# runs. Installing it needs Python 3.11+ and pip, nothing of the simulated fleet's.
dist: $(VENV)/.installed
	$(BIN)/python -m pip wheel -q --no-deps -w dist .
	@ls dist/gpufleet-*.whl

image: venv
	@$(FLEET) image
	@$(FLEET) image --release trixie

repo: venv
	@$(FLEET) repo

fleet: image repo
	@$(FLEET) up -i $(INVENTORY)

fleet-status: venv
	@$(FLEET) status

fleet-down: venv
	@$(FLEET) down

# The test control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok), built from pinned Go modules into ~/.cache/gpufleet (outside the clone) and
# reused from there; `cluster` starts it on 127.0.0.1 with one Node per running
# simulated node and prints the kubeconfig's path (.cache/cluster/kubeconfig).
controlplane:
	@bash tests/sim/controlplane/build.sh

cluster: venv controlplane
	@$(FLEET) cluster

cluster-down: venv
	@$(FLEET) cluster-down

# The main job: the reconciler converges the fleet (one cycle), then says where every
# node stands. `python -m runner reconcile -i inventories/sim` keeps it converged.
demo: fleet
	$(BIN)/python -m runner reconcile --once -i $(INVENTORY)
	$(BIN)/python -m runner status -i $(INVENTORY)

lint: venv
	yamllint --strict .
	ansible-lint
	ruff check src tests collections molecule playbooks
	ruff format --check src tests collections molecule playbooks
	mypy

# docs/roles/<role>.md from each role's meta/argument_specs.yml (a unit test checks
# they are in step).
docs: venv
	$(BIN)/python tests/tools/role_docs.py

# Real programs the unit tests feed our configs to: Debian's containerd 1.6 (and
# nvidia-smi, promtool), unpacked; containerd 2.4, built from its pinned Go module into
# ~/.cache/gpufleet (tests/tools/containerd).
consumers:
	@bash tests/tools/consumers.sh
	@bash tests/tools/containerd/build.sh >/dev/null

# NVIDIA's container toolkit (nvidia-ctk, ...), built from its pinned Go modules into
# ~/.cache/gpufleet, one directory per version: the oracle of tests/unit/test_runtime_oracle.py.
toolkit:
	@bash tests/sim/toolkit/build.sh

# NVIDIA's mig-parted, built from its pinned Go module into ~/.cache/gpufleet: run on the
# mock NVML by tests/unit/test_mig_parted.py.
migparted:
	@bash tests/sim/migparted/build.sh

# The 20 slowest unit tests are listed at the end.
unit: venv consumers toolkit migparted
	pytest --durations=20

# The reconciler against a small simulated fleet, through real ansible-runner, and
# with the cluster side against the test control plane. `make test` runs it in three
# parts: e2e-cluster after molecule (the cluster module: both use the test control
# plane; and the MPS module), then e2e-site (the adoption module, a site's own
# inventory and settings), and e2e-nodes, the rest, beside them. e2e-site is in lane 1
# and lint in lane 2 for the lanes' balance (e2e-nodes, with the kernel module's DKMS
# build, was the longer lane); each of the two installs the controller from the wheel
# once for its modules that run it (about 20 s). Each part lists every test's set-up,
# call and tear-down time at its end (--durations=0): where the suite's time goes.
E2E_CLUSTER := tests/e2e/test_cluster_e2e.py tests/e2e/test_mps_mount.py
E2E_SITE := tests/e2e/test_adoption_e2e.py
e2e: image repo controlplane consumers
	pytest tests/e2e --durations=0

e2e-cluster: image repo controlplane consumers
	pytest $(E2E_CLUSTER) --durations=0

e2e-site: image repo consumers
	pytest $(E2E_SITE) --durations=0

e2e-nodes: image repo consumers
	pytest tests/e2e $(addprefix --ignore=,$(E2E_CLUSTER) $(E2E_SITE)) --durations=0

# Not part of `make test`: measures, asserts nothing (see tests/bench).
bench: image repo
	$(BIN)/python tests/bench/reconcile_bench.py $(BENCH_ARGS)

# Scenario gpu-vm needs VMs with passthrough GPUs: only its syntax is checked here.
# Scenario cluster runs against the test control plane (molecule-cluster).
molecule: image repo
	image=$$($(FLEET) image); trixie=$$($(FLEET) image --release trixie); \
	  repo=$$($(FLEET) repo); \
	  export GPUSIM_IMAGE=$$image GPUSIM_IMAGE_TRIXIE=$$trixie GPUFLEET_REPO=$$repo; \
	  molecule test -s default && molecule test -s driver && molecule test -s runtime
	molecule syntax -s gpu-vm
	@echo "molecule gpu-vm: converge/verify skipped: needs VMs with PCI-passthrough GPUs" \
	  "(run: GPUFLEET_GPU_VM_INVENTORY=<file> molecule test -s gpu-vm)"
	$(MAKE) --no-print-directory molecule-cluster

# Scenario cluster against the test control plane, with three simulated nodes (a T4, an
# A100 pair under MIG and a CPU-only node) as the cluster's nodes. A site runs the same scenario with its own
# KUBECONFIG, GPUFLEET_CLUSTER_INVENTORY, GPUFLEET_CLUSTER_GROUP_VARS and _HOST_VARS.
MOLECULE_CLUSTER := $(CURDIR)/.cache/molecule-cluster
MOLECULE_CLUSTER_NODES := mol-k8s-t4=t4-1 mol-k8s-a100=a100-pcie-2 mol-k8s-cpu=none
MOLECULE_CLUSTER_NAMES := $(foreach n,$(MOLECULE_CLUSTER_NODES),$(firstword $(subst =, ,$(n))))
molecule-cluster: image repo controlplane
	@rm -rf $(MOLECULE_CLUSTER) && mkdir -p $(MOLECULE_CLUSTER)
	@ln -s $(CURDIR)/inventories/sim/group_vars $(MOLECULE_CLUSTER)/group_vars
	$(FLEET) up $(addprefix --node ,$(MOLECULE_CLUSTER_NODES)) \
	  --write-inventory $(MOLECULE_CLUSTER)/hosts.yml
	@exec 9>>.cache/cluster.lock && flock 9; \
	  started=$$([ -e .cache/cluster/pids/kube-apiserver.pid ] || echo yes); \
	  trap '[ -z "'$$started'" ] || $(FLEET) cluster-down; \
	    $(FLEET) down $(MOLECULE_CLUSTER_NAMES)' EXIT; \
	  kubeconfig=$$($(FLEET) cluster $(MOLECULE_CLUSTER_NAMES)); \
	  export KUBECONFIG=$$kubeconfig \
	    GPUFLEET_CLUSTER_INVENTORY=$(MOLECULE_CLUSTER)/hosts.yml \
	    GPUFLEET_CLUSTER_GROUP_VARS=$(MOLECULE_CLUSTER)/group_vars; \
	  molecule test -s cluster

# Everything the test lanes share, built first. The node images (debootstrap: mostly
# downloads and unpacking) are built beside the Go builds (mostly CPU), which run one
# at a time (a kube-apiserver link alone takes gigabytes); the package repository
# last, from the toolkit and mig-parted just built. On a warm machine each step only
# finds its cached result.
setup: venv
	$(MAKE) --no-print-directory -j2 --output-sync=target image builds
	@$(MAKE) --no-print-directory repo

builds: venv
	MAKEFLAGS= $(MAKE) --no-print-directory consumers toolkit migparted controlplane

# Two lanes side by side (tests/tools/suite.py), each part's time printed at the end.
# Parts that use the test control plane take turns with it (.cache/cluster.lock).
TEST_LANES := --lane "unit molecule e2e-cluster e2e-site" --lane "lint e2e-nodes"
test: setup
	$(BIN)/python tests/tools/suite.py $(TEST_LANES)

clean: fleet-down
	rm -rf .cache
