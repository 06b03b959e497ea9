#!/usr/bin/env bash
# Build the real control plane of the test world from published Go modules (nothing
# prebuilt is downloaded): kube-apiserver, etcd and the KubeRay operator with its CRDs.
# Each part is cached under ${XDG_CACHE_HOME:-~/.cache}/raysize/control-plane/<part>-<key>,
# keyed by its module's go.mod, go.sum and sources and by the Go version, so only the first
# run on a machine pays for the build (cold: ~10 minutes on 2 cores).
#
#   scripts/build_control_plane.sh [KUBERNETES_VERSION]   (default: v1.36.3)
#
# Prints one line per part, `name=path`, and writes the same lines to
# <cache>/control-plane/env-<KUBERNETES_VERSION> for sandbox.realworld to read.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kube=${1:-v1.36.3}
src="$top/sandbox/go"
[ -d "$src/kube-apiserver-$kube" ] || {
  echo "error: no module for kube-apiserver $kube in sandbox/go (have: $(cd "$src" && ls -d kube-apiserver-* | sed 's/kube-apiserver-//' | tr '\n' ' ')); generate it with scripts/gen_apiserver_module.sh $kube" >&2
  exit 2
}
command -v go >/dev/null || { echo "error: go is not on PATH (Go 1.25+ builds the control plane)" >&2; exit 2; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/raysize/control-plane"
mkdir -p "$cache"
gover=$(go env GOVERSION)

# build PART MODULE_DIR PACKAGE OUTPUT_NAME LDFLAGS [extra env...]: echoes the binary's path
build() {
  local part=$1 dir=$2 pkg=$3 out=$4 ldflags=$5
  shift 5
  local key
  key=$( (cd "$dir" && cat go.mod go.sum ./*.go; echo "$gover${ldflags:+ $ldflags} $*") | sha256sum | cut -c1-16)
  local dest="$cache/$part-$key"
  if [ ! -x "$dest/$out" ]; then
    echo "building $part (first run on this machine; cached in $dest)" >&2
    local t0=$SECONDS
    rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
    (cd "$dir" && env "$@" CGO_ENABLED=0 go build -trimpath -ldflags="-s -w $ldflags" -o "$dest.tmp/$out" "$pkg")
    rm -rf "$dest" && mv "$dest.tmp" "$dest"
    echo "built $part in $((SECONDS - t0)) s" >&2
  fi
  echo "$dest/$out"
}

# the version /version reports (kubectl and clients read it), as Kubernetes' own build sets it
minor=${kube#v1.}; minor=${minor%%.*}
vflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  vflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  vflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# GOEXPERIMENT=nojsonv2: with Go >= 1.27's json v2, /openapi/v2 breaks (docs/kubernetes-resize.md §5b)
apiserver=$(build "kube-apiserver-$kube" "$src/kube-apiserver-$kube" . kube-apiserver "$vflags" GOEXPERIMENT=nojsonv2)
etcd=$(build etcd "$src/etcd" . etcd "")
operator=$(build kuberay "$src/kuberay" github.com/ray-project/kuberay/ray-operator ray-operator "")
crd_dir="$(dirname "$operator")/crd"
if [ ! -f "$crd_dir/ray.io_rayclusters.yaml" ]; then
  mod=$(cd "$src/kuberay" && go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)
  mkdir -p "$crd_dir"
  cp "$mod"/config/crd/bases/ray.io_*.yaml "$crd_dir/"
  chmod u+w "$crd_dir"/*.yaml
fi
kuberay_version=$(cd "$src/kuberay" && go list -m -f '{{.Version}}' github.com/ray-project/kuberay/ray-operator)
{
  echo "kube_apiserver=$apiserver"
  echo "kubernetes_version=$kube"
  echo "etcd=$etcd"
  echo "ray_operator=$operator"
  echo "kuberay_version=$kuberay_version"
  echo "kuberay_crds=$crd_dir"
} | tee "$cache/env-$kube"
