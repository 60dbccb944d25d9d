//go:build tools

// Package tools pins kwok, which fakes the AMD GPU nodes and the kubelet's pod lifecycle.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
