package main

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// TestMain lets this test binary be the child that -broker kfake-process
// starts (os.Executable is the test binary here): run with -serve-kfake
// first, it serves a broker instead of running the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-serve-kfake" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestKfakeProcessServesALatencyRun runs the latency scenario against kfake
// in a child process: every committed row is acknowledged and consumed
// through the child's address, and the run returns (the child ended by its
// stdin closing).
func TestKfakeProcessServesALatencyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("smoke run skipped in -short mode")
	}
	rep, _ := runReport(t, []string{"-q", "-db", "sqlite", "-broker", "kfake-process", "-scenarios", "latency", "-modes", "local",
		"-rates", "50", "-latency-duration", "300ms"})
	if rep.Config.Broker != "kfake-process" {
		t.Errorf("report broker = %q; want kfake-process", rep.Config.Broker)
	}
	// run fails unless every committed row was acknowledged and consumed.
	if len(rep.Latency) != 1 || rep.Latency[0].Messages == 0 {
		t.Fatalf("latency results = %+v; want one run with its rows acknowledged and consumed", rep.Latency)
	}
}
