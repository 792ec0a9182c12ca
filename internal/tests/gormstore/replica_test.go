package gormstore_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/plugin/dbresolver"
)

// plainOn opens a second *gorm.DB, without plugins, on db's pool: the
// test's direct view of one database.
func plainOn(t *testing.T, name string, db *gorm.DB) *gorm.DB {
	t.Helper()
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	p, err := gorm.Open(testenv.DialectorOn(name, sqlDB), &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		t.Fatal(err)
	}
	return p.Session(&gorm.Session{SkipHooks: true})
}

// TestEveryStoreStatementRunsOnThePrimaryDespiteAReplica registers
// dbresolver with a real second database as a (badly) lagging replica that
// holds other rows and leases than the primary, and checks that every store
// operation reads and writes the primary: the acquisition round (its
// snapshot and read-back), discovery, batches (also concurrent ones, as the
// several buckets served at once run them), deletes, metrics, renewal and release.
//
// Two topologies: the *gorm.DB opened on the primary with Replicas only,
// and the *gorm.DB opened on a third, unrelated database with Sources: the
// primary and Replicas: the replica (the store must follow dbresolver's
// source even for its transactions, which dbresolver never switches).
func TestEveryStoreStatementRunsOnThePrimaryDespiteAReplica(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		for _, topo := range []string{"replicas", "sources+replicas"} {
			t.Run(o.Name+"/"+topo, func(t *testing.T) {
				primaryDB := o.Open(t, nil)
				replicaDB := o.Open(t, nil)
				storeDB := primaryDB
				if topo == "sources+replicas" {
					storeDB = o.Open(t, nil) // a decoy: the store must not use it
				}
				cfg := outbox.Config{BucketCount: 4}
				for _, db := range []*gorm.DB{primaryDB, replicaDB, storeDB} {
					if err := outbox.AutoMigrate(db, cfg); err != nil {
						t.Fatal(err)
					}
					if err := db.Exec("DELETE FROM " + cfg.LeasesTableName()).Error; err != nil { // the store seeds them
						t.Fatal(err)
					}
				}
				primary, replica := plainOn(t, o.Name, primaryDB), plainOn(t, o.Name, replicaDB)
				replicaPool, _ := replicaDB.DB()
				rc := dbresolver.Config{Replicas: []gorm.Dialector{testenv.DialectorOn(o.Name, replicaPool)}}
				if topo == "sources+replicas" {
					primaryPool, _ := primaryDB.DB()
					rc.Sources = []gorm.Dialector{testenv.DialectorOn(o.Name, primaryPool)}
				}
				if err := storeDB.Use(dbresolver.Register(rc)); err != nil {
					t.Fatalf("register dbresolver: %v", err)
				}

				// The replica: a ghost relay holds every bucket, bucket 1
				// has a row. The primary: no leases yet, two rows in bucket 0.
				ghost := "ghost"
				start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
				clock := relaytest.NewManualClock(start)
				far := start.Add(time.Hour).UnixMilli()
				for b := range 4 {
					if err := replica.Table(cfg.LeasesTableName()).Create(&outbox.BucketLease{Bucket: int32(b), Owner: &ghost, ExpiresAtMs: far}).Error; err != nil {
						t.Fatal(err)
					}
				}
				if err := replica.Table(cfg.RelaysTableName()).Create(&outbox.RelayHeartbeat{RelayID: ghost, LastSeenMs: far}).Error; err != nil {
					t.Fatal(err)
				}
				old := pendingMessage(1)
				old.CreatedAt = time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC)
				if err := replica.Table(cfg.MessagesTableName()).Create(old).Error; err != nil {
					t.Fatal(err)
				}
				fresh := []*outbox.Message{pendingMessage(0), pendingMessage(0)}
				fresh[0].CreatedAt = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
				if err := primary.Table(cfg.MessagesTableName()).Create(&fresh).Error; err != nil {
					t.Fatal(err)
				}
				count := func(db *gorm.DB) int64 {
					t.Helper()
					var n int64
					if err := db.Table(cfg.MessagesTableName()).Count(&n).Error; err != nil {
						t.Fatal(err)
					}
					return n
				}

				store, err := gormstore.New(storeDB, gormstore.Options{Config: cfg, Clock: clock})
				if err != nil {
					t.Fatal(err)
				}
				ctx := t.Context()
				const lease = 30 * time.Second
				owned, err := relaytest.Owned(store.AcquireBucketLeases(ctx, "relay-a", 4, lease))
				if err != nil || !slices.Equal(owned, []int{0, 1, 2, 3}) {
					t.Fatalf("AcquireBucketLeases = %v, %v; want [0 1 2 3] (the primary's leases)", owned, err)
				}
				var onPrimary int64
				if err := primary.Table(cfg.LeasesTableName()).Where("owner = ?", "relay-a").Count(&onPrimary).Error; err != nil || onPrimary != 4 {
					t.Fatalf("leases of relay-a on the primary = %d, %v; want 4", onPrimary, err)
				}
				pending, err := store.BucketsWithPending(ctx, owned)
				if err != nil || !slices.Equal(pending, []int{0}) {
					t.Fatalf("BucketsWithPending = %v, %v; want [0] (the primary's)", pending, err)
				}
				var wg sync.WaitGroup
				batches := make([][]*outbox.Message, 4)
				errs := make([]error, 4)
				for b := range 4 { // concurrently, as a relay serving several buckets does
					wg.Go(func() { batches[b], errs[b] = nextBatch(ctx, store, b, 10, 0) })
				}
				wg.Wait()
				for b := range 4 {
					want := 0
					if b == 0 {
						want = 2
					}
					if errs[b] != nil || len(batches[b]) != want {
						t.Fatalf("NextBatch(%d) = %d rows, %v; want %d (the primary's)", b, len(batches[b]), errs[b], want)
					}
				}
				if batches[0][0].MessageID != fresh[0].MessageID || batches[0][1].MessageID != fresh[1].MessageID {
					t.Fatalf("NextBatch(0) returned other rows than the primary's")
				}
				p, err := store.PendingMetrics(ctx)
				if err != nil || p.Count != 2 || !p.Oldest.Equal(fresh[0].CreatedAt) {
					t.Fatalf("PendingMetrics = %+v, %v; want 2 rows, oldest %v (the primary's)", p, err, fresh[0].CreatedAt)
				}
				// Renewal at the same instant: MySQL reports no changed row,
				// so the store verifies with a read, which must see the primary.
				ok, err := store.RenewBucketLeases(ctx, "relay-a", owned, lease)
				if err != nil || !ok {
					t.Fatalf("RenewBucketLeases (unchanged) = %v, %v; want true", ok, err)
				}
				clock.Advance(time.Second)
				ok, err = store.RenewBucketLeases(ctx, "relay-a", owned, lease)
				if err != nil || !ok {
					t.Fatalf("RenewBucketLeases = %v, %v; want true", ok, err)
				}
				var exp int64
				if err := primary.Table(cfg.LeasesTableName()).Where("bucket = 0").Pluck("expires_at_ms", &exp).Error; err != nil || exp != clock.Now().Add(lease).UnixMilli() {
					t.Fatalf("expiry on the primary after renewal = %d, %v; want %d", exp, err, clock.Now().Add(lease).UnixMilli())
				}
				if err := store.MarkPublished(ctx, batches[0]); err != nil {
					t.Fatal(err)
				}
				if n := count(primary); n != 0 {
					t.Fatalf("rows on the primary after MarkPublished = %d; want 0", n)
				}
				if err := store.ReleaseBucketLeases(ctx, "relay-a"); err != nil {
					t.Fatal(err)
				}
				var free int64
				if err := primary.Table(cfg.LeasesTableName()).Where("owner IS NULL").Count(&free).Error; err != nil || free != 4 {
					t.Fatalf("free leases on the primary after release = %d, %v; want 4", free, err)
				}
				var stopped int64
				if err := primary.Table(cfg.RelaysTableName()).Where("relay_id = ? AND stopped_at_ms IS NOT NULL", "relay-a").Count(&stopped).Error; err != nil || stopped != 1 {
					t.Fatalf("relay-a stamped stopped on the primary = %d, %v; want 1", stopped, err)
				}
				// The replica is untouched: still the ghost's leases and its row.
				var ghosts int64
				if err := replica.Table(cfg.LeasesTableName()).Where("owner = ?", ghost).Count(&ghosts).Error; err != nil || ghosts != 4 {
					t.Fatalf("ghost leases on the replica = %d, %v; want 4 (untouched)", ghosts, err)
				}
				if n := count(replica); n != 1 {
					t.Fatalf("rows on the replica = %d; want 1 (untouched)", n)
				}
				if topo == "sources+replicas" {
					var n int64
					for _, table := range []string{cfg.LeasesTableName(), cfg.RelaysTableName()} {
						if err := plainOn(t, o.Name, storeDB).Table(table).Count(&n).Error; err != nil || n != 0 {
							t.Fatalf("rows in %s of the decoy default connection = %d, %v; want 0", table, n, err)
						}
					}
				}
			})
		}
	}
}
