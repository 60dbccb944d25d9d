//go:build tools

// Package tools pins KEDA's operator and its external metrics API server (the "adapter"), which scale a
// SpeculativeModel through its /scale subresource from a Prometheus query (docs/autoscaling.md).
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
