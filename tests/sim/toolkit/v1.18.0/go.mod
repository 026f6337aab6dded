// NVIDIA's container toolkit 1.18.0, built by ../build.sh from its published Go module:
// every version the build takes is pinned here and in go.sum, nowhere else. The toolkit's
// own go.mod has no replace directives, and build.sh checks that this module selects
// exactly the versions it requires.
//
// `nvidia-ctk --version` reports the release commit below, as upstream's packages do.
// The module proxy records it too (Origin.Hash of v1.18.0); build.sh checks they agree.
//
// Release commit: f8daa5e26de9fd7eb79259040b6dd5a52060048c
module gpufleet.test/toolkit/v1.18.0

go 1.26.0

tool (
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk
)

require (
	github.com/NVIDIA/go-nvlib v0.8.1 // indirect
	github.com/NVIDIA/go-nvml v0.13.0-1 // indirect
	github.com/NVIDIA/nvidia-container-toolkit v1.18.0 // indirect
	github.com/cyphar/filepath-securejoin v0.5.0 // indirect
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/moby/sys/reexec v0.1.0 // indirect
	github.com/moby/sys/symlink v0.3.0 // indirect
	github.com/opencontainers/runc v1.3.2 // indirect
	github.com/opencontainers/runtime-spec v1.2.1 // indirect
	github.com/opencontainers/runtime-tools v0.9.1-0.20221107090550-2e043c6bd626 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/syndtr/gocapability v0.0.0-20200815063812-42c35b437635 // indirect
	github.com/urfave/cli-altsrc/v3 v3.1.0 // indirect
	github.com/urfave/cli/v3 v3.4.1 // indirect
	golang.org/x/mod v0.29.0 // indirect
	golang.org/x/sys v0.37.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	sigs.k8s.io/yaml v1.4.0 // indirect
	tags.cncf.io/container-device-interface v1.0.1 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.0.0 // indirect
)
