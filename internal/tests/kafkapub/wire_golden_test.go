package kafkapub_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// The reference batches kafkapub/internal/wire's
// TestEncodeRecordBatch_matches_a_transactional_kgo_producer compares its
// encoder with: the record batches a transactional franz-go producer sends
// for two transactions of 20 records on 2 partitions, captured as the
// in-process broker receives them. That package cannot import franz-go
// (the library module does not require it), nor can this one import it
// (it is internal to kafkapub), so the batches are committed there as
// testdata, written by
//
//	go test ./internal/tests/kafkapub -run TestKgoTransactionalBatchesGolden -update-kgo-batches
//
// Without the flag this test checks that franz-go still sends those bytes
// (the producer id and epoch aside, which the broker assigns) and that its
// transactions committed (read back with read_committed).

var updateKgoBatches = flag.Bool("update-kgo-batches", false, "write kafkapub/internal/wire/testdata/"+kgoBatchesFile)

const (
	kgoBatchesFile = "kgo_transactional_batches.txt"
	// The v2 record batch's layout: the CRC-32C covers attributes..end;
	// the broker assigns the producer id and epoch.
	batchOffAttributes    = 21
	batchOffProducerID    = 43
	batchOffBaseSequence  = 53
	batchOffRecordsCount  = 57
	kgoBatchesTimestampMs = 1796119200000 // 2026-12-01T10:00:00Z: every record's
)

func TestKgoTransactionalBatchesGolden(t *testing.T) {
	b := testenv.NewFake(t)
	topic := "reference"
	b.CreateTopic(t, topic, 2, nil)

	type batch struct {
		partition int32
		raw       []byte
	}
	var mu sync.Mutex
	var captured []batch
	seen := map[kmsg.Request]bool{} // When runs once per partition of a request
	b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true, When: func(r kmsg.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if seen[r] {
			return true
		}
		seen[r] = true
		for _, tp := range r.(*kmsg.ProduceRequest).Topics {
			for _, pp := range tp.Partitions {
				captured = append(captured, batch{pp.Partition, bytes.Clone(pp.Records)})
			}
		}
		return true
	}})

	cl, err := kgo.NewClient(
		kgo.SeedBrokers(b.Addrs...),
		kgo.TransactionalID("reference"),
		kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := time.UnixMilli(kgoBatchesTimestampMs)
	for txn := range 2 {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		for i := range 20 {
			r := &kgo.Record{Partition: int32(i % 2), Timestamp: ts, Value: []byte(fmt.Sprintf("v-%d-%d", txn, i))}
			if i%5 != 0 {
				r.Key = []byte(fmt.Sprintf("k%d", i%3))
			}
			if i%4 == 0 {
				r.Headers = []kgo.RecordHeader{{Key: "h", Value: []byte{byte(i)}}, {Key: "x-outbox-message-id", Value: []byte("0b9a6f7e-0000-4000-8000-000000000000")}}
			}
			recs = append(recs, r)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}

	mu.Lock()
	batches := captured
	mu.Unlock()
	// In partition order, each partition's in sequence order.
	slices.SortStableFunc(batches, func(x, y batch) int {
		return cmp.Or(cmp.Compare(x.partition, y.partition),
			cmp.Compare(binary.BigEndian.Uint32(x.raw[batchOffBaseSequence:]), binary.BigEndian.Uint32(y.raw[batchOffBaseSequence:])))
	})
	records := 0
	var lines []string
	for _, bt := range batches {
		records += int(binary.BigEndian.Uint32(bt.raw[batchOffRecordsCount:]))
		lines = append(lines, fmt.Sprintf("%d %x", bt.partition, bt.raw))
	}
	if records != 40 {
		t.Fatalf("captured %d records in %d batches; want 40", records, len(batches))
	}
	// The transactions committed: a read_committed consumer sees every record.
	if recs := readIsolated(t, b, topic, kgo.ReadCommitted(), 40, 200*time.Millisecond); len(recs) != 40 {
		t.Fatalf("read %d records; want 40", len(recs))
	}

	path := "../../../kafkapub/internal/wire/testdata/" + kgoBatchesFile
	if *updateKgoBatches {
		out := "# The record batches a transactional franz-go producer sent (2 transactions of\n" +
			"# 20 records on 2 partitions, as the in-process broker received them): a line per\n" +
			"# batch, its partition and its bytes in hex. Written by\n" +
			"#   go test ./internal/tests/kafkapub -run TestKgoTransactionalBatchesGolden -update-kgo-batches\n" +
			strings.Join(lines, "\n") + "\n"
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var golden []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if !strings.HasPrefix(l, "#") {
			golden = append(golden, l)
		}
	}
	if len(golden) != len(lines) {
		t.Fatalf("%s holds %d batches; franz-go sent %d (regenerate it: see this test's comment)", kgoBatchesFile, len(golden), len(lines))
	}
	for i, l := range golden {
		var part int32
		var h string
		if _, err := fmt.Sscanf(l, "%d %s", &part, &h); err != nil {
			t.Fatalf("%s line %q: %v", kgoBatchesFile, l, err)
		}
		raw, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		got := batches[i].raw
		same := part == batches[i].partition && len(raw) == len(got) &&
			bytes.Equal(raw[batchOffAttributes:batchOffProducerID], got[batchOffAttributes:batchOffProducerID]) &&
			bytes.Equal(raw[batchOffBaseSequence:], got[batchOffBaseSequence:])
		if !same {
			t.Fatalf("batch %d of %s differs from what franz-go sent (producer id and epoch aside); regenerate it (see this test's comment):\nfile %d %x\nkgo  %d %x", i, kgoBatchesFile, part, raw, batches[i].partition, got)
		}
	}
}
