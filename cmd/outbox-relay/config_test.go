package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
)

// TestBucketCountZeroMeansTheDefault: -bucket-count 0 means the default, 8,
// as a zero outbox.Config.BucketCount does, and everything the worker
// reports says 8.
func TestBucketCountZeroMeansTheDefault(t *testing.T) {
	cfg, err := parseConfig([]string{"-db-driver", "sqlite", "-db-dsn", "x.db", "-kafka-brokers", "a:1", "-bucket-count", "0"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.outbox.BucketCount != outbox.DefaultBucketCount {
		t.Errorf("bucket count = %d; want %d", cfg.outbox.BucketCount, outbox.DefaultBucketCount)
	}
	var help bytes.Buffer
	usage(&help)
	if !strings.Contains(help.String(), "0 means the default") {
		t.Errorf("-h does not document -bucket-count 0:\n%s", help.String())
	}
}

// TestListenDefaultsToLoopback: without -listen the HTTP server binds the
// loopback interface only, and -h says how to expose it to a probe.
func TestListenDefaultsToLoopback(t *testing.T) {
	cfg, err := parseConfig([]string{"-db-driver", "sqlite", "-db-dsn", "x.db", "-kafka-brokers", "a:1"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != "127.0.0.1:9090" {
		t.Errorf("-listen default = %q; want 127.0.0.1:9090", cfg.listen)
	}
	var help bytes.Buffer
	usage(&help)
	if !strings.Contains(help.String(), "-listen :9090") {
		t.Errorf("-h does not say how to expose the server:\n%s", help.String())
	}
}
