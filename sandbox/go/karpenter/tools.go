// Karpenter with its kwok cloud provider (the one Karpenter's own tests run: real
// Karpenter, simulated nodes), built from its published Go module:
// `go build -o karpenter-kwok sigs.k8s.io/karpenter/kwok` inside this module pins the
// version and checks every dependency against go.sum. The module's go.mod asks for Go
// 1.26.9: scripts/build_control_plane.sh builds it with GOTOOLCHAIN=auto, so an older
// local Go fetches that toolchain (itself a module on the Go proxy) for this part only.
//go:build tools

package tools

import _ "sigs.k8s.io/karpenter/kwok"
