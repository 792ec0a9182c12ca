package main

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
)

// TestBucketCountUnsetTakesTheTables: -bucket-count left unset (or 0)
// takes the fleet's count, the lease table's, once the worker has opened
// the database; the default, 8, on a table without rows; and help flags
// says so.
func TestBucketCountUnsetTakesTheTables(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		driver, dsn := dsnOf(t, db)
		p := testenv.Unique("bc")
		cfg := outbox.Config{BucketCount: 16, MessagesTable: p + "_messages", LeasesTable: p + "_leases", RelaysTable: p + "_relays"}
		for _, seeded := range []bool{false, true} {
			if seeded {
				if err := outbox.AutoMigrate(db, cfg); err != nil {
					t.Fatal(err)
				}
			}
			c, err := parseConfig([]string{"-db-driver", driver, "-db-dsn", dsn, "-kafka-brokers", "a:1", "-bucket-count", "0",
				"-messages-table", cfg.MessagesTable, "-leases-table", cfg.LeasesTable, "-relays-table", cfg.RelaysTable}, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			got, err := openDB(t.Context(), &c.dbConfig, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			closeDB(got)
			want := outbox.DefaultBucketCount
			if seeded {
				want = 16
			}
			if c.outbox.BucketCount != want {
				t.Errorf("bucket count with the lease table seeded=%v = %d; want %d", seeded, c.outbox.BucketCount, want)
			}
		}
	})
	var help bytes.Buffer
	flagsUsage(&help)
	if !strings.Contains(help.String(), "0: the table's, or 8 on an empty table") {
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

// TestEveryRelayOptionHasAFlag: each relay.Options field an operator can
// set has a flag, which relay errors name; the rest are Go values, and
// SingleWriter follows -db-driver.
func TestEveryRelayOptionHasAFlag(t *testing.T) {
	fs := newFlagSet(&config{})
	programmatic := map[string]bool{"Clock": true, "Logger": true, "MeterProvider": true, "Notifier": true, "HintTransport": true, "SingleWriter": true}
	for f := range reflect.TypeFor[relay.Options]().Fields() {
		if programmatic[f.Name] {
			continue
		}
		name := flagNames.Replace("Options." + f.Name)
		if !strings.HasPrefix(name, "-") || fs.Lookup(name[1:]) == nil {
			t.Errorf("relay.Options.%s has no flag (flagNames gives %q)", f.Name, name)
		}
	}
}

// TestBatchFlagsSetTheRelayOptions: -max-batch-bytes and
// -max-concurrent-buckets (or their variables) reach relay.Options; left
// unset, -max-concurrent-buckets stays 0, so that the relay scales it with
// its share of the buckets.
func TestBatchFlagsSetTheRelayOptions(t *testing.T) {
	base := []string{"-db-driver", "sqlite", "-db-dsn", "x.db", "-kafka-brokers", "a:1"}
	cfg, err := parseConfig(base, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.relay.MaxBatchBytes != relay.DefaultMaxBatchBytes || cfg.relay.MaxConcurrentBuckets != 0 {
		t.Errorf("defaults = %d bytes, %d buckets; want %d, 0", cfg.relay.MaxBatchBytes, cfg.relay.MaxConcurrentBuckets, relay.DefaultMaxBatchBytes)
	}
	env := map[string]string{"OUTBOX_MAX_CONCURRENT_BUCKETS": "2"}
	cfg, err = parseConfig(append(base, "-max-batch-bytes", "1048576"), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.relay.MaxBatchBytes != 1<<20 || cfg.relay.MaxConcurrentBuckets != 2 {
		t.Errorf("-max-batch-bytes 1048576, OUTBOX_MAX_CONCURRENT_BUCKETS=2 = %d, %d", cfg.relay.MaxBatchBytes, cfg.relay.MaxConcurrentBuckets)
	}
	if _, err := parseConfig(append(base, "-max-concurrent-buckets", "-1"), noEnv); err == nil || !strings.Contains(oneLine(err), "-max-concurrent-buckets -1 is negative") {
		t.Errorf("-max-concurrent-buckets -1: error %v; want one naming the flag", err)
	}
}

// TestZeroIsRefusedWhereItWouldMeanTheDefault: a number or duration flag
// with a default other than 0 refuses an explicit 0, naming the flag (or
// its variable) and the default; a flag whose default is 0 accepts it.
// -bucket-count keeps its documented "0 means the default".
func TestZeroIsRefusedWhereItWouldMeanTheDefault(t *testing.T) {
	base := []string{"-db-driver", "sqlite", "-db-dsn", "x.db", "-kafka-brokers", "a:1"}
	newFlagSet(&config{}).VisitAll(func(f *flag.Flag) {
		_, ierr := strconv.ParseInt(f.DefValue, 10, 64)
		_, derr := time.ParseDuration(f.DefValue)
		if (ierr != nil && derr != nil) || f.Name == "bucket-count" {
			return
		}
		_, err := parseConfig(append(base, "-"+f.Name, "0"), noEnv)
		if f.DefValue == "0" || f.DefValue == "0s" {
			if err != nil {
				t.Errorf("-%s 0: %v; want it accepted", f.Name, err)
			}
			return
		}
		want := fmt.Sprintf(`-%s "0": must be positive; leave it unset for the default, %s`, f.Name, f.DefValue)
		if err == nil || err.Error() != want {
			t.Errorf("-%s 0: error %v; want %q", f.Name, err, want)
		}
	})
	_, err := parseConfig(base, func(k string) string { return map[string]string{"OUTBOX_POLL_INTERVAL": "0s"}[k] })
	if err == nil || !strings.Contains(err.Error(), `OUTBOX_POLL_INTERVAL="0s": must be positive`) {
		t.Errorf("OUTBOX_POLL_INTERVAL=0s: error %v; want one naming the variable", err)
	}
}

// TestHelpSaysHowThePublishBoundsDiffer: -kafka-publish-timeout fails one
// call, which is retried; -max-publish-duration stops the relay.
func TestHelpSaysHowThePublishBoundsDiffer(t *testing.T) {
	fs := newFlagSet(&config{})
	for name, words := range map[string][]string{
		"kafka-publish-timeout": {"fails", "retries it after -error-backoff"},
		"max-publish-duration":  {"not a timeout", "stops the relay", "-kafka-publish-timeout", "-lease-duration", "0: no assertion"},
	} {
		var help bytes.Buffer
		printFlag(&help, fs.Lookup(name))
		for _, w := range words {
			if !strings.Contains(help.String(), w) {
				t.Errorf("help flags on -%s lacks %q:\n%s", name, w, help.String())
			}
		}
	}
}
