// NVIDIA's container toolkit 1.17.8, built by ../build.sh from its published Go module:
// every version the build takes is pinned here and in go.sum, nowhere else. The toolkit's
// own go.mod has no replace directives, and build.sh checks that this module selects
// exactly the versions it requires.
//
// `nvidia-ctk --version` reports the release commit below, as upstream's packages do.
// The module proxy does not record this version's commit (its .info has no Origin):
// this is the commit the v1.17.8 tag of github.com/NVIDIA/nvidia-container-toolkit
// points at (committed 2025-05-30T13:44:16Z, the time the proxy gives for v1.17.8).
//
// Release commit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d
module gpufleet.test/toolkit/v1.17.8

go 1.26.0

tool (
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk
)

require (
	github.com/NVIDIA/go-nvlib v0.7.2 // indirect
	github.com/NVIDIA/go-nvml v0.12.4-1 // indirect
	github.com/NVIDIA/nvidia-container-toolkit v1.17.8 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.5 // indirect
	github.com/cyphar/filepath-securejoin v0.4.1 // indirect
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/moby/sys/reexec v0.1.0 // indirect
	github.com/moby/sys/symlink v0.3.0 // indirect
	github.com/opencontainers/runc v1.2.6 // indirect
	github.com/opencontainers/runtime-spec v1.2.1 // indirect
	github.com/opencontainers/runtime-tools v0.9.1-0.20221107090550-2e043c6bd626 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/syndtr/gocapability v0.0.0-20200815063812-42c35b437635 // indirect
	github.com/urfave/cli/v2 v2.27.5 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
	golang.org/x/mod v0.20.0 // indirect
	golang.org/x/sys v0.28.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	sigs.k8s.io/yaml v1.3.0 // indirect
	tags.cncf.io/container-device-interface v0.8.1 // indirect
	tags.cncf.io/container-device-interface/specs-go v0.8.0 // indirect
)
