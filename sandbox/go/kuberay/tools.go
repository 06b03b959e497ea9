// The real KubeRay operator, built from its published Go module (its go.mod has no
// replace directives): `go build -o ray-operator github.com/ray-project/kuberay/ray-operator`
// inside this module pins the version and checks every dependency against go.sum.
//go:build tools

package tools

import _ "github.com/ray-project/kuberay/ray-operator"
