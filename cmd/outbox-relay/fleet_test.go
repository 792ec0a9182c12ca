package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// fleetWatch samples the lease and relay tables every 25 ms, as the fleet
// sees them: a bucket has a live owner while its lease is unexpired and its
// owner's heartbeat is live (not stopped, seen within the lease duration).
// It records how long each stretch without a live owner lasted.
type fleetWatch struct {
	t    *testing.T
	db   *gorm.DB
	cfg  outbox.Config
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	owners   map[int]string    // latest sample: bucket → live owner
	since    map[int]time.Time // buckets without a live owner since
	longest  time.Duration     // longest stretch without a live owner since reset
	sampling error
}

const fleetLease = 30 * time.Second // the workers' default -lease-duration

func watchFleet(t *testing.T, db *gorm.DB, cfg outbox.Config) *fleetWatch {
	w := &fleetWatch{t: t, db: db, cfg: cfg, stop: make(chan struct{}), done: make(chan struct{}), since: map[int]time.Time{}}
	go func() {
		defer close(w.done)
		for {
			w.sample()
			select {
			case <-w.stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(w.stop); <-w.done })
	return w
}

func (w *fleetWatch) sample() {
	var leases []outbox.BucketLease
	var beats []outbox.RelayHeartbeat
	now := time.Now().UnixMilli()
	err := w.db.Table(w.cfg.LeasesTableName()).Find(&leases).Error
	if err == nil {
		err = w.db.Table(w.cfg.RelaysTableName()).Find(&beats).Error
	}
	live := map[string]bool{}
	for _, b := range beats {
		live[b.RelayID] = b.StoppedAtMs == nil && b.LastSeenMs > now-fleetLease.Milliseconds()
	}
	owners := map[int]string{}
	for _, l := range leases {
		if l.Owner != nil && l.ExpiresAtMs > now && live[*l.Owner] {
			owners[int(l.Bucket)] = *l.Owner
		}
	}
	at := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.sampling = err
		return
	}
	w.owners = owners
	for b := range w.cfg.WithDefaults().BucketCount {
		s, was := w.since[b]
		_, owned := owners[b]
		switch {
		case owned && was:
			w.longest = max(w.longest, at.Sub(s))
			delete(w.since, b)
		case !owned && !was:
			w.since[b] = at
		}
	}
}

// shares returns the number of buckets each live owner holds, and the
// buckets without one, in the latest sample.
func (w *fleetWatch) shares() (map[string]int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for _, o := range w.owners {
		out[o]++
	}
	return out, w.cfg.WithDefaults().BucketCount - len(w.owners)
}

// reset forgets the longest stretch so far (stretches still open count from
// their start).
func (w *fleetWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.longest = 0
}

// unowned returns the longest stretch without a live owner since reset,
// open stretches included.
func (w *fleetWatch) unowned() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.longest
	for _, s := range w.since {
		d = max(d, time.Since(s))
	}
	return d
}

// await waits up to within for the relays ids to own every bucket in fair
// shares (differing by at most one), and returns how long it took.
func (w *fleetWatch) await(what string, within time.Duration, ids []string, logs fmt.Stringer) time.Duration {
	w.t.Helper()
	start := time.Now()
	n := w.cfg.WithDefaults().BucketCount
	want := map[string]int{}
	for _, id := range ids {
		want[id] = n / len(ids)
	}
	for {
		got, free := w.shares()
		fair := len(got) == len(ids)
		for _, id := range ids {
			fair = fair && got[id]-want[id] >= 0 && got[id]-want[id] <= 1
		}
		if free == 0 && fair {
			return time.Since(start)
		}
		if time.Since(start) > within {
			w.mu.Lock()
			err := w.sampling
			w.mu.Unlock()
			w.t.Fatalf("%s: owners %v and %d buckets without one after %v; want fair shares for %v within %v (sampling error: %v)\n%s", what, got, free, time.Since(start).Round(time.Millisecond), ids, within, err, logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// multiLogs prints several workers' logs.
type multiLogs []*workerProc

func (m multiLogs) String() string {
	var b strings.Builder
	for _, w := range m {
		if w != nil {
			fmt.Fprintf(&b, "--- %s\n%s\n", w.cmd.Args[len(w.cmd.Args)-1], w.logs)
		}
	}
	return b.String()
}

// fleetArgs are the flags of a worker of cfg's tables with default lease
// and poll timings, under relay id id (the last argument).
func fleetArgs(driver, dsn string, cfg outbox.Config, brokers []string, id string, extra ...string) []string {
	args := []string{"-db-driver", driver, "-db-dsn", dsn, "-kafka-brokers", strings.Join(brokers, ","), "-listen", "127.0.0.1:0", "-log-format", "json",
		"-messages-table", cfg.MessagesTable, "-leases-table", cfg.LeasesTable, "-relays-table", cfg.RelaysTable}
	return append(append(args, extra...), "-relay-id", id)
}

// TestFleetRefusesARelayWithAnotherBucketCount: with a worker serving the
// lease table's 8 buckets, a worker started with -bucket-count 16 (or 4)
// exits 1 at once with one error line naming both counts, is never counted
// as a peer, and every bucket keeps its owner. A worker with -bucket-count
// unset serves the table's count.
func TestFleetRefusesARelayWithAnotherBucketCount(t *testing.T) {
	bin := buildWorker(t)
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		driver, dsn := dsnOf(t, db)
		p := testenv.Unique("fc")
		cfg := outbox.Config{MessagesTable: p + "_messages", LeasesTable: p + "_leases", RelaysTable: p + "_relays"}
		if err := outbox.AutoMigrate(db, cfg); err != nil {
			t.Fatal(err)
		}
		broker := testenv.NewFake(t)
		watch := watchFleet(t, db, cfg)
		a := startWorker(t, bin, fleetArgs(driver, dsn, cfg, broker.Addrs, "relay-a"))
		watch.await("the unset count takes the table's 8", 10*time.Second, []string{"relay-a"}, a.logs)
		watch.reset()
		for _, count := range []string{"16", "4"} {
			code, stderr := runWorker(t, bin, fleetArgs(driver, dsn, cfg, broker.Addrs, "relay-"+count, "-bucket-count", count)...)
			if code != exitFailure {
				t.Fatalf("-bucket-count %s against a table of 8: exit %d; want %d\n%s", count, code, exitFailure, stderr)
			}
			var errLines []string
			for _, l := range strings.Split(stderr, "\n") {
				if strings.Contains(l, `"level":"ERROR"`) {
					errLines = append(errLines, l)
				}
			}
			if len(errLines) != 1 || !strings.Contains(errLines[0], "holds 8 buckets and this relay's bucket count is "+count) || !strings.Contains(errLines[0], "misconfigured") {
				t.Fatalf("-bucket-count %s: error lines %q; want one naming the table's 8 and %s", count, errLines, count)
			}
			t.Logf("-bucket-count %s: %s", count, errLines[0])
			var beats int64
			if err := db.Table(cfg.RelaysTableName()).Where("relay_id = ? AND stopped_at_ms IS NULL", "relay-"+count).Count(&beats).Error; err != nil || beats != 0 {
				t.Fatalf("live heartbeat rows of the refused relay = %d, %v; want 0 (never a peer)", beats, err)
			}
		}
		if got, free := watch.shares(); free != 0 || got["relay-a"] != 8 {
			t.Fatalf("owners after the refusals = %v, %d unowned; want relay-a on all 8", got, free)
		}
		if d := watch.unowned(); d > 0 {
			t.Fatalf("a bucket went without a live owner for %v; want none", d)
		}
		a.terminate(t)
	})
}

// TestFleetMembershipChangesHandBucketsOverAtOnce runs workers with the
// default lease timings (30 s leases, 10 s renewals, 1 s polling) and no
// cross-process wake-ups: three started together own every bucket, each
// its fair share, within 3 s; a graceful stop hands every bucket over
// within 2 s, and rows committed meanwhile are published within 3 s; a
// joining worker gets its share within 3 s with no bucket unowned for more
// than 1 s.
func TestFleetMembershipChangesHandBucketsOverAtOnce(t *testing.T) {
	bin := buildWorker(t)
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		driver, dsn := dsnOf(t, db)
		p := testenv.Unique("fm")
		cfg := outbox.Config{MessagesTable: p + "_messages", LeasesTable: p + "_leases", RelaysTable: p + "_relays"}
		useOutbox(t, db, cfg)
		broker := testenv.NewFake(t)
		topic := testenv.Unique("fleet-")
		broker.CreateTopic(t, topic, 8, nil)
		watch := watchFleet(t, db, cfg)

		workers := make([]*workerProc, 4)
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				workers[i] = startWorker(t, bin, fleetArgs(driver, dsn, cfg, broker.Addrs, fmt.Sprintf("relay-%d", i)))
			})
		}
		wg.Wait()
		logs := multiLogs(workers)
		took := watch.await("three workers started together", 3*time.Second, []string{"relay-0", "relay-1", "relay-2"}, logs)
		t.Logf("three workers started together: fair shares after %v", took.Round(time.Millisecond))

		// A graceful stop of relay-1, with rows committed meanwhile.
		watch.reset()
		stopped := make(chan struct{})
		go func() { defer close(stopped); workers[1].terminate(t) }()
		msgs := make([]*outbox.Message, 40)
		for i := range msgs {
			msgs[i] = outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i), "v")
		}
		committed := time.Now()
		if err := outbox.Enqueue(db, msgs...); err != nil {
			t.Fatal(err)
		}
		<-stopped
		took = watch.await("a graceful stop", 2*time.Second, []string{"relay-0", "relay-2"}, logs)
		t.Logf("graceful stop: every bucket handed over %v after the stop; longest without a live owner %v", took.Round(time.Millisecond), watch.unowned().Round(time.Millisecond))
		for {
			var n int64
			if err := db.Table(cfg.MessagesTableName()).Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Logf("rows committed during the stop published %v after their commit", time.Since(committed).Round(time.Millisecond))
				break
			}
			if time.Since(committed) > 3*time.Second {
				t.Fatalf("%d of %d rows committed during the stop still pending after %v\n%s", n, len(msgs), time.Since(committed).Round(time.Millisecond), logs)
			}
			time.Sleep(10 * time.Millisecond)
		}

		// relay-3 joins.
		watch.reset()
		workers[3] = startWorker(t, bin, fleetArgs(driver, dsn, cfg, broker.Addrs, "relay-3"))
		logs = multiLogs(workers)
		took = watch.await("a joining worker", 3*time.Second, []string{"relay-0", "relay-2", "relay-3"}, logs)
		if d := watch.unowned(); d > time.Second {
			t.Fatalf("a bucket went %v without a live owner while relay-3 joined; want at most 1s\n%s", d, logs)
		}
		t.Logf("join: fair shares after %v; longest without a live owner %v", took.Round(time.Millisecond), watch.unowned().Round(time.Millisecond))
		for _, i := range []int{0, 2, 3} {
			workers[i].terminate(t)
		}
	})
}
