"""gpusim: the hardware half of a simulated GPU node.

A test fixture for gpufleet. It lives only inside the simulated-node image
(/opt/gpusim, marker /etc/gpusim-node) and simulates what a container cannot have:
the PCI devices, the kernel modules and their device files, and what NVML reads from
the driver (for the mock libnvidia-ml.so.1 of tests/sim/nvml, on which NVIDIA's own
nvidia-smi runs). Everything else on a simulated node is real Debian: apt, dpkg,
systemd and the NVIDIA packages.

Every entry point refuses to run on a host without the marker file, so none of this
can act on a real GPU server.
"""
