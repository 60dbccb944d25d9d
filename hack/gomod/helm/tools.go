//go:build tools

// Package tools pins helm (for the chart tests) and the Gateway API module whose standard CRDs
// hack/cluster installs.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
	_ "sigs.k8s.io/gateway-api/apis/v1"
)
