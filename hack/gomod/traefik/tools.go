//go:build tools

// Package tools pins the Traefik proxy that hack/cluster builds from this module: a real Gateway API
// implementation (its kubernetesGateway provider) for the local cluster's data path.
package tools

import _ "github.com/traefik/traefik/v3/cmd/traefik"
