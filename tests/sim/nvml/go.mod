// Where the mock NVML (mock_nvml.c) takes NVIDIA's nvml.h from: the header published
// in the go-nvml module, at the version pinned here and in go.sum. No Go code is
// built from it.
module gpufleet.test/nvml

go 1.26.0

require github.com/NVIDIA/go-nvml v0.13.4-1
