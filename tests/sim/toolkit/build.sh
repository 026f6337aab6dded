#!/usr/bin/env bash
# Build NVIDIA's container toolkit (nvidia-ctk, nvidia-container-runtime,
# nvidia-container-runtime-hook, nvidia-cdi-hook) from its published Go module, once per
# upstream version, into a cache outside the clone keyed by the version and a hash of
# the recipe. Prints the directory that holds the binaries, one line per version, in the
# order asked for. A second run, or another clone on the same machine, reuses them.
#
#   build.sh [VERSION...]    e.g. build.sh 1.18.0; no argument: every version below
#   GPUFLEET_BUILD_CACHE     where built binaries live (default ~/.cache/gpufleet)
#
# One Go module can require only one version of another, so each toolkit version has a
# build module of its own, v<VERSION>/go.mod (+ go.sum), which pins every version the
# build takes. The Go checksum database is not reachable from the machines this runs
# on, so the checksums committed in go.sum are what every download is held to
# (GOFLAGS=-mod=readonly: a module whose hash differs fails the build).
#
# The binaries are stamped the way upstream's Makefile stamps them: internal/info.version
# is the release version and internal/info.gitCommit the release commit, so that
# `nvidia-ctk --version` says what it is. The commit is pinned in each go.mod (the module
# proxy records it for some versions only); where the proxy does record it, the two must
# agree.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${GPUFLEET_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet}"
toolkit=github.com/NVIDIA/nvidia-container-toolkit
tools=(nvidia-ctk nvidia-container-runtime nvidia-container-runtime-hook nvidia-cdi-hook)

command -v go >/dev/null || { echo "build.sh: Go is needed to build the container toolkit (Go >= 1.26)" >&2; exit 1; }

# cgo: go-nvml reaches libnvidia-ml.so.1 through dlopen from C, and every command links it.
export GOFLAGS="-mod=readonly -buildvcs=false" GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=1

if [ "$#" -eq 0 ]; then
  set --
  for mod in "$here"/v*/go.mod; do
    v="$(basename "$(dirname "$mod")")"
    set -- "$@" "${v#v}"
  done
fi

# Fails unless the build module selects exactly the versions the toolkit's own go.mod
# requires: then the binaries are built from what upstream released, not from whatever
# a newer dependency of ours would have pulled in.
check_selection() {
  local upstream_mod="$1"
  python3 - "$upstream_mod" <<'EOF'
import json, subprocess, sys

upstream = json.loads(subprocess.run(["go", "mod", "edit", "-json", sys.argv[1]],
                                     check=True, capture_output=True, text=True).stdout)
if upstream.get("Replace"):
    sys.exit(f"build.sh: {sys.argv[1]} has replace directives, which a module that "
             "requires it does not follow: mirror them in this build module")
selected = dict(line.split() for line in subprocess.run(
    ["go", "list", "-m", "-f", "{{.Path}} {{.Version}}", "all"],
    check=True, capture_output=True, text=True).stdout.splitlines()[1:])
wrong = [f"  {r['Path']}: upstream {r['Version']}, here {selected.get(r['Path'])}"
         for r in upstream["Require"] if selected.get(r["Path"]) != r["Version"]]
if wrong:
    sys.exit("build.sh: this build module selects other versions than the toolkit "
             "requires:\n" + "\n".join(wrong))
EOF
}

build_version() {
  local version="$1" module="$here/v$1"
  [ -f "$module/go.mod" ] || { echo "build.sh: no build module for toolkit $version ($module/go.mod)" >&2; exit 1; }
  cd "$module"
  local recipe out
  recipe="$( (cat go.mod go.sum "$here/build.sh"; go env GOVERSION) | sha256sum | cut -c1-12)"
  out="$cache_root/toolkit/$version-$recipe"

  local complete=1 tool
  for tool in "${tools[@]}"; do [ -x "$out/bin/$tool" ] || complete=0; done
  if [ "$complete" = 1 ]; then
    echo "$out/bin"
    return
  fi

  local required
  required="$(go list -m -f '{{.Version}}' "$toolkit")"
  [ "$required" = "v$version" ] || { echo "build.sh: $module/go.mod requires $toolkit $required, not v$version" >&2; exit 1; }
  local info upstream_mod origin pinned
  info="$(go mod download -json "$toolkit@v$version")"
  upstream_mod="$(sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p' <<<"$info")"
  check_selection "$upstream_mod"
  origin="$(python3 -c 'import json, sys; print(json.load(sys.stdin).get("Origin", {}).get("Hash", ""))' <<<"$info")"
  pinned="$(sed -n 's#^// Release commit: \([0-9a-f]\{40\}\)$#\1#p' go.mod)"
  [ -n "$pinned" ] || { echo "build.sh: $module/go.mod names no '// Release commit: <40 hex digits>'" >&2; exit 1; }
  if [ -n "$origin" ] && [ "$origin" != "$pinned" ]; then
    echo "build.sh: the module proxy says v$version is commit $origin, $module/go.mod says $pinned" >&2
    exit 1
  fi

  # What upstream's Makefile passes (EXTLDFLAGS: NVML's symbols are resolved at dlopen).
  local info_pkg="$toolkit/internal/info"
  local ldflags="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy'"
  ldflags+=" -X $info_pkg.version=$version -X $info_pkg.gitCommit=$pinned"

  echo "building the container toolkit $version into $out" >&2
  local start=$SECONDS tmp="$out.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp/bin"
  trap "rm -rf '$tmp'" EXIT
  go build -trimpath -ldflags "$ldflags" -o "$tmp/bin/" tool
  for tool in "${tools[@]}"; do [ -x "$tmp/bin/$tool" ] || { echo "build.sh: $tool was not built" >&2; exit 1; }; done
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
  echo "built in $((SECONDS - start)) s" >&2
  echo "$out/bin"
}

for version in "$@"; do
  build_version "${version#v}"
done
