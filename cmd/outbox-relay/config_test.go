package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
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
	flagsUsage(&help)
	if !strings.Contains(help.String(), "0 means the default") {
		t.Errorf("help flags does not document -bucket-count 0:\n%s", help.String())
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
	flagsUsage(&help)
	if !strings.Contains(help.String(), "-listen :9090") {
		t.Errorf("help flags does not say how to expose the server:\n%s", help.String())
	}
}

// TestParkPolicyFlagsSetTheRelayOptions: -park-policy and -park-after (or
// their variables) set relay.Options.ParkPolicy and ParkAfter; the default
// is the library's (unpublishable, 3), and a policy that does not exist is
// a configuration error naming the flag.
func TestParkPolicyFlagsSetTheRelayOptions(t *testing.T) {
	base := []string{"-db-driver", "sqlite", "-db-dsn", "x.db", "-kafka-brokers", "a:1"}
	none := func(string) string { return "" }
	cfg, err := parseConfig(base, none)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.relay.ParkPolicy != relay.ParkUnpublishable || cfg.relay.ParkAfter != relay.DefaultParkAfter {
		t.Errorf("defaults = %v, %d; want unpublishable, %d", cfg.relay.ParkPolicy, cfg.relay.ParkAfter, relay.DefaultParkAfter)
	}
	cfg, err = parseConfig(append(base, "-park-policy", "never", "-park-after", "5"), none)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.relay.ParkPolicy != relay.ParkNever || cfg.relay.ParkAfter != 5 {
		t.Errorf("-park-policy never -park-after 5 = %v, %d", cfg.relay.ParkPolicy, cfg.relay.ParkAfter)
	}
	env := map[string]string{"OUTBOX_PARK_POLICY": "any-failure"}
	cfg, err = parseConfig(base, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.relay.ParkPolicy != relay.ParkAnyFailure {
		t.Errorf("OUTBOX_PARK_POLICY=any-failure gives %v", cfg.relay.ParkPolicy)
	}
	if _, err := parseConfig(append(base, "-park-policy", "sometimes"), none); err == nil || !strings.Contains(err.Error(), "-park-policy") {
		t.Errorf("-park-policy sometimes: error %v; want one naming -park-policy", err)
	}
}
