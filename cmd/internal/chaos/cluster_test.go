package chaos_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestPartitionLeaderFailoverLosesNothing runs three relay processes
// publishing a steady stream from PostgreSQL to a topic with replication
// factor 3 and min.insync.replicas 2 on the three-node cluster of
// `scripts/services.sh start-cluster`, while it alternately SIGKILLs the
// leader of a partition (restarted 12 s later) and SIGSTOPs one for 12 s
// (longer than the relays' 5 s publish timeout and the brokers' 9 s session
// timeout), one fault at a time. Every committed message arrives (0 lost),
// no rolled-back one does, per-key order holds after deduplication, the
// table drains, and acknowledgements resume within bounds after every fault
// (the longest stalls, and whether the partition got a new leader, are
// logged).
//
// Opt-in twice: OUTBOX_CHAOS=1 and the cluster's environment
// (OUTBOX_TEST_KAFKA_CLUSTER_BROKERS, OUTBOX_TEST_KAFKA_CLUSTER_DIR, from
// `eval "$(scripts/services.sh start-cluster)"`); CI starts no cluster.
func TestPartitionLeaderFailoverLosesNothing(t *testing.T) {
	if v := os.Getenv(EnvChaos); v == "" || v == "0" {
		t.Skipf("set %s=1 to run the reliability harness", EnvChaos)
	}
	cluster, ok := testenv.Cluster(t)
	if !ok {
		t.Skipf("%s is not set: start the cluster with eval \"$(scripts/services.sh start-cluster)\"", testenv.EnvKafkaCluster)
	}
	if len(cluster.Addrs) < 3 {
		t.Fatalf("%s names %d brokers; want 3", testenv.EnvKafkaCluster, len(cluster.Addrs))
	}
	for node := 1; node <= 3; node++ {
		if _, err := cluster.PID(node); err != nil {
			t.Fatalf("cluster node %d: %v", node, err)
		}
	}
	bin, _ := setup(t)
	dialect, dsn := chaos.Postgres, os.Getenv(testenv.EnvPostgres)
	if dsn == "" {
		t.Skipf("needs %s (the relays are separate processes)", testenv.EnvPostgres)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const (
		publishTimeout    = 5 * time.Second
		maxTopicStall     = 20 * time.Second // 9 s session timeout, with room for a busy machine
		maxPartitionStall = 30 * time.Second // + 6 s metadata refresh + a 5 s publish timeout
	)
	s, err := chaos.FailoverRun(ctx, chaos.FailoverConfig{
		Env: chaos.Env{Bin: bin, Dialect: dialect, BaseDSN: dsn, Brokers: cluster.Addrs, Dir: t.TempDir()}, Nodes: cluster,
		Relays: 3, Faults: 4, Messages: 15000, WriteFor: 120 * time.Second,
		KillDowntime: 12 * time.Second, PauseFor: 12 * time.Second, PublishTimeout: publishTimeout,
		Seed: time.Now().UnixNano(),
	})
	t.Log(s)
	t.Logf("faults:\n%s", chaos.FormatFailover(s))
	if err != nil {
		t.Fatalf("FailoverRun: %v", err)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if s.Count(chaos.FaultLeaderKill) < 1 || s.Count(chaos.FaultLeaderPause) < 1 {
		t.Fatalf("faults: %d leader kills, %d leader pauses; want at least one of each", s.Count(chaos.FaultLeaderKill), s.Count(chaos.FaultLeaderPause))
	}
	for i, f := range s.Faults {
		if f.LeaderMoved < 0 {
			// Kafka's choice, not the library's: with unclean election off,
			// a partition whose other replicas were not in sync at that
			// moment stays offline until the node is back. What the relays
			// must do then (lose nothing, keep order) is checked above.
			t.Logf("fault %d (%s of node %d): partition %d got no new leader in the %v the node was down (no other in-sync replica: it stayed offline)", i+1, f.Kind, f.Node, f.Partition, f.Held.Round(time.Second))
		}
		// With acks=all every partition waits for the silent node until the
		// controller fences it (broker.session.timeout.ms, 9 s): the whole
		// topic stalls about that long. The victim's partition then waits
		// for kafka-go's next metadata refresh (Transport.MetadataTTL, 6 s)
		// and the relays' next attempt (publish timeout 5 s, backoff).
		if f.Stall > maxTopicStall {
			t.Errorf("fault %d (%s of node %d): no acknowledgement on the topic for %v; want at most %v", i+1, f.Kind, f.Node, f.Stall.Round(time.Millisecond), maxTopicStall)
		}
		if f.PartitionStall > maxPartitionStall {
			t.Errorf("fault %d (%s of node %d): no acknowledgement on partition %d for %v; want at most %v", i+1, f.Kind, f.Node, f.Partition, f.PartitionStall.Round(time.Millisecond), maxPartitionStall)
		}
	}
}
