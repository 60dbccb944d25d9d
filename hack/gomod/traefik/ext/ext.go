// Package ext stands in for Traefik's dynamic-configuration extension module.
//
// Traefik's go.mod replaces github.com/traefik/traefik/dynamic/ext with ./pkg/config/dynamic/ext, a nested
// module that the module zip on the Go proxy leaves out (nested modules are never part of a zip) and that
// the proxy does not serve on its own. Upstream it holds empty structs that dynamic.HTTP and dynamic.Router
// embed inline so downstream distributions can add fields; an open-source build has none, so empty
// structs are the whole of it.
package ext

// HTTP is embedded inline in dynamic.HTTP.
type HTTP struct{}

// Router is embedded inline in dynamic.Router.
type Router struct{}
