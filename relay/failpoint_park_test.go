//go:build outbox_failpoints

package relay_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestParkStatementAfterTheLeaseWasLostAtTheFailpointChangesNothing
// (defect 3 of issue 27, built with -tags outbox_failpoints): the relay
// checks its lease, then stops at the relay/before-park failpoint (a real
// 300 ms sleep) while its lease expires on the manual clock and relay-b
// takes the bucket; the Park statement it sends afterwards must park
// nothing. It runs itself in a child process, whose failpoints are armed
// from the start.
func TestParkStatementAfterTheLeaseWasLostAtTheFailpointChangesNothing(t *testing.T) {
	const env = "OUTBOX_FAILPOINTS"
	if os.Getenv(env) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestParkStatementAfterTheLeaseWasLostAtTheFailpointChangesNothing$", "-test.v")
		cmd.Env = append(os.Environ(), env+"=relay/before-park=sleep(300ms)@1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		t.Logf("child:\n%s", out)
		return
	}
	h := newHarness(t, relay.Options{BucketCount: 1}, nil)
	k := keyed("K", 2)
	h.store.AddToBucket(0, k[0], k[1])
	rejectKey(h, "K", errTooLarge, rejectingAlways())
	taken := make(chan struct{})
	h.ops.setBlock(relaytest.OpFleet, func(ctx context.Context) error {
		go func() {
			defer close(taken)
			// The relay answers Fleet, checks its lease again and
			// sleeps at the failpoint; meanwhile its lease expires.
			time.Sleep(100 * time.Millisecond)
			h.clock.Advance(relay.DefaultLeaseDuration + time.Second)
			if got, err := relaytest.Owned(h.store.AcquireBucketLeases(context.Background(), "relay-b", 1, relay.DefaultLeaseDuration)); err != nil || len(got) != 1 {
				t.Errorf("relay-b acquired %v, %v; want bucket 0", got, err)
			}
		}()
		h.ops.setBlock(relaytest.OpFleet, nil)
		return nil
	})
	h.start()
	h.waitIdle()
	// The step returns at the idle wait after the cycle that asked
	// Fleet, slept at the failpoint and sent the Park statement.
	h.step("the Park statement sent", 40, func() bool { return h.ops.count(relaytest.OpPark) > 0 })
	<-taken
	if got := h.store.ParkedIDs(0); len(got) != 0 {
		t.Fatalf("parked %v after relay-a lost bucket 0 to relay-b at the failpoint; want nothing", got)
	}
	if got := h.store.Owners()[0]; got != "relay-b" {
		t.Fatalf("bucket 0 owned by %q; want relay-b", got)
	}
}
