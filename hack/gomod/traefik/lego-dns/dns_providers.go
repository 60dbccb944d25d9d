// Package dns is lego's DNS-01 provider factory without its providers (see hack/gomod/traefik/README.md).
package dns

import (
	"fmt"

	"github.com/go-acme/lego/v5/challenge"
)

// NewDNSChallengeProviderByName refuses every provider: this build carries no DNS-01 solvers.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("DNS-01 provider %q is not part of this build", name)
}
