//go:build tools

// Package tools pins the Prometheus server, which scrapes the fake pods' metrics for KEDA's prometheus trigger
// (docs/autoscaling.md). Built with remove_all_sd: static_configs, file_sd and http_sd stay (plugins/minimum.go).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
