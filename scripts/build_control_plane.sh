#!/usr/bin/env bash
# Build the real control plane of the test world from published Go modules (no prebuilt
# binary is downloaded, but Go's own toolchain where a module asks for a newer one):
# kube-apiserver, kube-scheduler and kube-controller-manager (one module,
# sandbox/go/kubernetes-<version>), etcd, the KubeRay operator with its CRDs and Karpenter
# (its kwok provider) with its CRDs; and what the deploy/ tests use: helm and helm-docs
# (deploy/helm) and the Prometheus Operator's CRDs (deploy/components/monitoring is
# dry-run against them).
# Each part is cached under ${XDG_CACHE_HOME:-~/.cache}/raysize/control-plane/<part>-<key>,
# keyed by its module's go.mod, go.sum and sources and by the Go version, so only the first
# run on a machine pays for the build (cold: ~10 minutes on 2 cores).
#
#   scripts/build_control_plane.sh [KUBERNETES_VERSION]   (default: v1.36.3)
#
# Prints one line per part, `name=path`, and writes the same lines to
# <cache>/control-plane/env-<KUBERNETES_VERSION> for sandbox.realworld to read. On stderr,
# one line per part as it starts and as it ends, with the time it took
# (`building kube-apiserver v1.36.3 ...` then `building kube-apiserver v1.36.3 ... done in
# 142 s`), or `kube-apiserver v1.36.3: cached` when it was built before.
# RAYSIZE_CONTROL_PLANE_DRY_RUN=1: build and download nothing, write no env file; a part
# not in the cache is `<part>: not built (dry run)`.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kube=${1:-v1.36.3}
src="$top/sandbox/go"
kubernetes="$src/kubernetes-$kube"
[ -d "$kubernetes" ] || {
  echo "error: no module for Kubernetes $kube in sandbox/go (have: $(cd "$src" && ls -d kubernetes-* | sed 's/kubernetes-//' | tr '\n' ' ')); generate it with scripts/gen_apiserver_module.sh $kube" >&2
  exit 2
}
command -v go >/dev/null || { echo "error: go is not on PATH (Go 1.26+ builds the control plane)" >&2; exit 2; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/raysize/control-plane"
mkdir -p "$cache"
gover=$(go env GOVERSION)
dry_run=${RAYSIZE_CONTROL_PLANE_DRY_RUN:-}

# part LABEL CACHED DIR: says whether LABEL (a part and its version) is cached; returns 0
# when it must be made now, after saying `building LABEL ...` (part_done ends the line)
part() {
  local label=$1 cached=$2 dir=$3
  if [ "$cached" = yes ]; then
    echo "$label: cached" >&2
    return 1
  fi
  if [ -n "$dry_run" ]; then
    echo "$label: not built (dry run)" >&2
    return 1
  fi
  echo "building $label ... (first run on this machine; cached in $dir)" >&2
  part_t0=$SECONDS
}
part_done() {
  echo "building $1 ... done in $((SECONDS - part_t0)) s" >&2
}
# the version a module requires of PATH, read from its go.mod (no network)
required() {
  sed -n "s|^[[:space:]]*\(require \)\{0,1\}$2 \(v[^ ]*\).*|\2|p" "$1/go.mod" | head -1
}

# build PART VERSION MODULE_DIR PACKAGE OUTPUT_NAME LDFLAGS [extra env...]: echoes the
# binary's path. PACKAGE is the module's own `./cmd/<name>` or a package of a module it
# requires (built from the module's root, whose tools.go names it)
build() {
  local part=$1 version=$2 dir=$3 pkg=$4 out=$5 ldflags=$6
  shift 6
  local key sources=.
  [[ $pkg == ./* ]] && sources=$pkg
  key=$( (cd "$dir" && cat go.mod go.sum "$sources"/*.go; echo "$gover${ldflags:+ $ldflags} $*") | sha256sum | cut -c1-16)
  local dest="$cache/$part-$key" label="${part%-"$version"} $version" cached=no
  [ -x "$dest/$out" ] && cached=yes
  if part "$label" $cached "$dest"; then
    rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
    (cd "$dir" && env "$@" CGO_ENABLED=0 go build -trimpath -ldflags="-s -w $ldflags" -o "$dest.tmp/$out" "$pkg")
    rm -rf "$dest" && mv "$dest.tmp" "$dest"
    part_done "$label"
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
# GOEXPERIMENT=nojsonv2: with Go >= 1.27's json v2, /openapi/v2 breaks (docs/design/kubernetes-resize.md §5b).
# The scheduler and controller manager are built the same way, so they reuse the packages
# Go's build cache holds from the apiserver's build (client-go, apimachinery, pkg/apis, ...)
kube_cmd() {
  build "$1-$kube" "$kube" "$kubernetes" "./cmd/$1" "$1" "$vflags" GOEXPERIMENT=nojsonv2
}
apiserver=$(kube_cmd kube-apiserver)
scheduler=$(kube_cmd kube-scheduler)
controller_manager=$(kube_cmd kube-controller-manager)
etcd=$(build etcd "$(required "$src/etcd" go.etcd.io/etcd/server/v3)" "$src/etcd" . etcd "")
kuberay_required=$(required "$src/kuberay" github.com/ray-project/kuberay/ray-operator)
operator=$(build kuberay "$kuberay_required" "$src/kuberay" github.com/ray-project/kuberay/ray-operator ray-operator "")
crd_dir="$(dirname "$operator")/crd"
cached=no
[ -f "$crd_dir/ray.io_rayclusters.yaml" ] && cached=yes
if part "KubeRay CRDs $kuberay_required" $cached "$crd_dir"; then
  mod=$(cd "$src/kuberay" && go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)
  mkdir -p "$crd_dir"
  cp "$mod"/config/crd/bases/ray.io_*.yaml "$crd_dir/"
  chmod u+w "$crd_dir"/*.yaml
  part_done "KubeRay CRDs $kuberay_required"
fi
# Karpenter with its kwok cloud provider, for the tests that need nodes made on demand
# (tests/sandbox/test_karpenter.py): its module asks for Go 1.26.9, so this part alone
# builds with GOTOOLCHAIN=auto (a local Go older than that fetches the toolchain the
# module names, from the Go proxy, once). Its CRDs come from the same module: NodePool and
# NodeClaim as its kwok chart installs them (kwok/charts/crds, with the rules of the
# karpenter.kwok.sh labels), with the NodeOverlay and CapacityBuffer ones it watches, and
# the KWOKNodeClass one (kwok/apis/crds)
karpenter_version=$(required "$src/karpenter" sigs.k8s.io/karpenter)
karpenter=$(build karpenter "$karpenter_version" "$src/karpenter" sigs.k8s.io/karpenter/kwok karpenter-kwok "-X sigs.k8s.io/karpenter/pkg/operator.Version=$karpenter_version" GOTOOLCHAIN=auto)
karpenter_crds="$(dirname "$karpenter")/crd"
cached=no
[ -f "$karpenter_crds/karpenter.kwok.sh_kwoknodeclasses.yaml" ] && cached=yes
if part "Karpenter CRDs $karpenter_version" $cached "$karpenter_crds"; then
  mod=$(cd "$src/karpenter" && GOTOOLCHAIN=auto go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)
  rm -rf "$karpenter_crds.tmp" && mkdir -p "$karpenter_crds.tmp"
  cp "$mod"/kwok/charts/crds/*.yaml "$mod"/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml "$karpenter_crds.tmp/"
  chmod u+w "$karpenter_crds.tmp"/*.yaml
  rm -rf "$karpenter_crds" && mv "$karpenter_crds.tmp" "$karpenter_crds"
  part_done "Karpenter CRDs $karpenter_version"
fi
helm_version=$(required "$src/helm" helm.sh/helm/v3)
# the ldflags helm's own Makefile sets: its version, and the Kubernetes version `helm
# template` and `helm lint` assume (client-go's minor, as 1.<minor>) instead of 1.20
client_go=$(required "$src/helm" k8s.io/client-go)
k8s_minor=$(echo "$client_go" | cut -d. -f2)
hflags="-X helm.sh/helm/v3/internal/version.version=$helm_version"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  hflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
helm=$(build helm "$helm_version" "$src/helm" helm.sh/helm/v3/cmd/helm helm "$hflags")
# the Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule), from its Go
# module's example/prometheus-operator-crd: nothing is built, the module is only downloaded
prom_op_version=v0.85.0
prom_crds="$cache/prometheus-operator-crds-$prom_op_version"
cached=no
[ -f "$prom_crds/monitoring.coreos.com_prometheusrules.yaml" ] && cached=yes
if part "Prometheus Operator CRDs $prom_op_version" $cached "$prom_crds"; then
  mod=$(cd "$src/helm" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$prom_op_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$mod/example/prometheus-operator-crd" ] || { echo "error: no example/prometheus-operator-crd in $mod" >&2; exit 2; }
  rm -rf "$prom_crds.tmp" && mkdir -p "$prom_crds.tmp"
  for kind in servicemonitors podmonitors prometheusrules; do
    cp "$mod/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$prom_crds.tmp/"
  done
  chmod u+w "$prom_crds.tmp"/*.yaml
  rm -rf "$prom_crds" && mv "$prom_crds.tmp" "$prom_crds"
  part_done "Prometheus Operator CRDs $prom_op_version"
fi
# helm-docs, which writes deploy/helm/raysize/README.md from its values.yaml comments
# (tests/deploy/test_helm_docs.py regenerates it and fails on a diff): `go install` of its
# tagged module (its own go.sum, checked against the Go checksum database), keyed by version
helm_docs_version=v1.14.2
helm_docs_dest="$cache/helm-docs-$helm_docs_version-$(echo "$gover" | sha256sum | cut -c1-8)"
cached=no
[ -x "$helm_docs_dest/helm-docs" ] && cached=yes
if part "helm-docs $helm_docs_version" $cached "$helm_docs_dest"; then
  rm -rf "$helm_docs_dest.tmp" && mkdir -p "$helm_docs_dest.tmp"
  (cd "$top" && GOBIN="$helm_docs_dest.tmp" CGO_ENABLED=0 go install -trimpath -ldflags="-s -w" \
    "github.com/norwoodj/helm-docs/cmd/helm-docs@$helm_docs_version")
  rm -rf "$helm_docs_dest" && mv "$helm_docs_dest.tmp" "$helm_docs_dest"
  part_done "helm-docs $helm_docs_version"
fi
kuberay_version=$kuberay_required
out="$cache/env-$kube"
[ -z "$dry_run" ] || out=/dev/null
{
  echo "kube_apiserver=$apiserver"
  echo "kube_scheduler=$scheduler"
  echo "kube_controller_manager=$controller_manager"
  echo "kubernetes_version=$kube"
  echo "etcd=$etcd"
  echo "ray_operator=$operator"
  echo "kuberay_version=$kuberay_version"
  echo "kuberay_crds=$crd_dir"
  echo "karpenter=$karpenter"
  echo "karpenter_version=$karpenter_version"
  echo "karpenter_crds=$karpenter_crds"
  echo "helm=$helm"
  echo "helm_docs=$helm_docs_dest/helm-docs"
  echo "prometheus_operator_version=$prom_op_version"
  echo "prometheus_operator_crds=$prom_crds"
} | tee "$out"
