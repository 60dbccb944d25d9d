//go:build tools

// Package tools pins promtool, which unit-tests the chart's PrometheusRule alerts (`promtool test rules`).
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
