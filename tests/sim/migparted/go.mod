// NVIDIA's mig-parted v0.10.0 (nvidia-mig-parted), built by build.sh from its published Go
// module: every version the build takes is pinned here and in go.sum, nowhere else. This
// module requires nothing else, so Go selects exactly the versions mig-parted's own go.mod
// requires. v0.10.0 is the release the module proxy here serves.
module gpufleet.test/migparted

go 1.26.0

require github.com/NVIDIA/mig-parted v0.10.0
