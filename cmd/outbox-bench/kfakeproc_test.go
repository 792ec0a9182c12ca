package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"
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

// TestKfakeProcessIsAChildThatEndsWithStop proves the broker of
// -broker kfake-process runs in another process, serves its address, and
// is gone once stop returns (its stdin closed).
func TestKfakeProcessIsAChildThatEndsWithStop(t *testing.T) {
	p, err := startKfakeProcess(context.Background(), 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			p.stop()
		}
	}()
	if pid := p.cmd.Process.Pid; pid == os.Getpid() {
		t.Fatalf("broker pid = %d; want a child, not this process", pid)
	}
	if len(p.addrs) == 0 {
		t.Fatal("no broker address read from the child")
	}
	conn, err := net.DialTimeout("tcp", p.addrs[0], 5*time.Second)
	if err != nil {
		t.Fatalf("dial the child's broker at %s: %v", p.addrs[0], err)
	}
	conn.Close()
	p.stop()
	stopped = true
	if st := p.cmd.ProcessState; st == nil || !st.Exited() || !st.Success() {
		t.Fatalf("child after stop: %v; want exited with status 0", st)
	}
	if conn, err := net.DialTimeout("tcp", p.addrs[0], time.Second); err == nil {
		conn.Close()
		t.Errorf("broker at %s still accepts connections after stop", p.addrs[0])
	}
}
