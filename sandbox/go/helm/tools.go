// The helm CLI, built from its published Go module (helm.sh/helm/v3 has no replace
// directives): `go build -o helm helm.sh/helm/v3/cmd/helm` inside this module pins the
// version and checks every dependency against go.sum. Used by the tests of deploy/helm.
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
