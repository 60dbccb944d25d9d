//go:build tools

// Package tools pins the etcd server that hack/cluster builds from this module.
package tools

import _ "go.etcd.io/etcd/server/v3"
